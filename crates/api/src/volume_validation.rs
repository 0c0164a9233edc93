//! Validation of a pod's volumes, its containers' `volumeMounts`, and environment read from
//! ConfigMaps and Secrets (`configMapKeyRef`, `secretKeyRef`, `envFrom`), with Kubernetes' field
//! paths and messages. Volume types and fields Shepherd does not implement are refused by name.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::error::Cause;
use crate::quantity::{self, Quantity};

const NOT_SUPPORTED: &str = "not supported by Shepherd";

/// The volume sources Shepherd implements.
const SOURCES: &[&str] = &["emptyDir", "configMap", "secret", "downwardAPI", "projected", "hostPath"];

/// Kubernetes' volume sources Shepherd does not implement, and fields of mounts and projections
/// it lacks: refused by name, and left out of the OpenAPI documents.
pub(crate) const UNSUPPORTED: &[(&str, &str)] = &[
    ("io.k8s.api.core.v1.Volume", "awsElasticBlockStore"),
    ("io.k8s.api.core.v1.Volume", "azureDisk"),
    ("io.k8s.api.core.v1.Volume", "azureFile"),
    ("io.k8s.api.core.v1.Volume", "cephfs"),
    ("io.k8s.api.core.v1.Volume", "cinder"),
    ("io.k8s.api.core.v1.Volume", "csi"),
    ("io.k8s.api.core.v1.Volume", "ephemeral"),
    ("io.k8s.api.core.v1.Volume", "fc"),
    ("io.k8s.api.core.v1.Volume", "flexVolume"),
    ("io.k8s.api.core.v1.Volume", "flocker"),
    ("io.k8s.api.core.v1.Volume", "gcePersistentDisk"),
    ("io.k8s.api.core.v1.Volume", "gitRepo"),
    ("io.k8s.api.core.v1.Volume", "glusterfs"),
    ("io.k8s.api.core.v1.Volume", "image"),
    ("io.k8s.api.core.v1.Volume", "iscsi"),
    ("io.k8s.api.core.v1.Volume", "nfs"),
    ("io.k8s.api.core.v1.Volume", "persistentVolumeClaim"),
    ("io.k8s.api.core.v1.Volume", "photonPersistentDisk"),
    ("io.k8s.api.core.v1.Volume", "portworxVolume"),
    ("io.k8s.api.core.v1.Volume", "quobyte"),
    ("io.k8s.api.core.v1.Volume", "rbd"),
    ("io.k8s.api.core.v1.Volume", "scaleIO"),
    ("io.k8s.api.core.v1.Volume", "storageos"),
    ("io.k8s.api.core.v1.Volume", "vsphereVolume"),
    ("io.k8s.api.core.v1.VolumeMount", "subPathExpr"),
    ("io.k8s.api.core.v1.VolumeMount", "mountPropagation"),
    ("io.k8s.api.core.v1.VolumeMount", "recursiveReadOnly"),
    ("io.k8s.api.core.v1.VolumeProjection", "clusterTrustBundle"),
];

const HOST_PATH_TYPES: &[&str] =
    &["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"];

/// Pod fields the downward API writes into a volume file.
const VOLUME_FIELD_PATHS: &[&str] =
    &["metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"];
const VOLUME_RESOURCES: &[&str] = &["limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu",
    "requests.memory", "requests.ephemeral-storage"];

const ENV_NAME_RULE: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', \
     '-', or '.', and must not start with a digit";
const MODE_RULE: &str = "must be a number between 0 and 0777 (octal), both inclusive";
const DNS1123_LABEL_RULE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
     '-', start and end with an alphanumeric character, and be at most 63 characters";
const KEY_RULE: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' \
(e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

fn join(base: &str, key: &str) -> String {
    if base.is_empty() { key.to_string() } else { format!("{base}.{key}") }
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn quoted(s: &str) -> String {
    Value::from(s).to_string()
}

fn invalid(field: impl Into<String>, value: &str, why: &str) -> Cause {
    Cause::invalid(field, format!("Invalid value: {}: {why}", quoted(value)))
}

fn unsupported(field: impl Into<String>, value: &str, supported: &[&str]) -> Cause {
    let list = supported.iter().map(|s| quoted(s)).collect::<Vec<_>>().join(", ");
    Cause::not_supported(field, format!("Unsupported value: {}: supported values: {list}", quoted(value)))
}

/// The entries of `v[key]` that are objects.
fn objects_in<'a>(v: &'a Value, keys: &[&'a str]) -> Vec<&'a str> {
    keys.iter().copied().filter(|k| v.get(*k).is_some_and(Value::is_object)).collect()
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty() && b.len() <= 63 && b.iter().all(|&c| alnum(c) || c == b'-') && alnum(b[0]) && alnum(b[b.len() - 1])
}

/// Kubernetes' config key rule (ConfigMap and Secret keys).
fn is_config_key(k: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._".contains(&b);
    !k.is_empty() && k.len() <= 253 && k.bytes().all(allowed) && !k.starts_with("..")
}

/// `[-._a-zA-Z][-._a-zA-Z0-9]*`: what Kubernetes calls a valid environment variable name.
pub fn is_env_var_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || b"-._".contains(&c))
        && b.all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c))
}

/// A relative path that stays below its base: no leading `/`, no `..` component.
fn check_descending_path(path: &str, field: &str, c: &mut Vec<Cause>) {
    if path.starts_with('/') {
        c.push(invalid(field, path, "must be a relative path"));
    }
    if path.split('/').any(|part| part == "..") {
        c.push(invalid(field, path, "must not contain '..'"));
    }
}

fn check_mode(v: &Value, key: &str, p: &str, c: &mut Vec<Cause>) {
    match v.get(key) {
        None | Some(Value::Null) => {}
        Some(m) if m.as_i64().is_some_and(|m| (0..=0o777).contains(&m)) => {}
        Some(m) => c.push(Cause::invalid(join(p, key), format!("Invalid value: {m}: {MODE_RULE}"))),
    }
}

/// Fields of `v` not in `known` are refused by name (a Kubernetes field Shepherd lacks).
fn refuse_other_fields(v: &Value, known: &[&str], p: &str, c: &mut Vec<Cause>) {
    for (k, val) in v.as_object().into_iter().flatten() {
        let set = !matches!(val, Value::Null | Value::Bool(false)) && val.as_str() != Some("");
        if set && !known.contains(&k.as_str()) {
            c.push(Cause::forbidden(join(p, k), NOT_SUPPORTED));
        }
    }
}

fn check_items(v: &Value, p: &str, c: &mut Vec<Cause>) {
    let Some(Value::Array(items)) = v.get("items") else { return };
    let mut paths = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let ip = format!("{p}.items[{i}]");
        if str_of(item, "key").is_none_or(str::is_empty) {
            c.push(Cause::required(join(&ip, "key")));
        }
        check_item_path(item, &ip, &mut paths, c);
        check_mode(item, "mode", &ip, c);
    }
}

fn check_item_path(item: &Value, ip: &str, paths: &mut BTreeSet<String>, c: &mut Vec<Cause>) {
    match str_of(item, "path").filter(|s| !s.is_empty()) {
        None => c.push(Cause::required(join(ip, "path"))),
        Some(path) => {
            check_descending_path(path, &join(ip, "path"), c);
            if path.split('/').next().is_some_and(|first| first.starts_with("..")) {
                c.push(invalid(join(ip, "path"), path, "must not start with '..'"));
            }
            if !paths.insert(path.to_string()) {
                let message = format!("Duplicate value: {}", quoted(path));
                c.push(Cause::new("FieldValueDuplicate", join(ip, "path"), message));
            }
        }
    }
}

fn check_downward_items(v: &Value, p: &str, c: &mut Vec<Cause>) {
    let Some(Value::Array(items)) = v.get("items") else { return };
    let mut paths = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let ip = format!("{p}.items[{i}]");
        check_item_path(item, &ip, &mut paths, c);
        check_mode(item, "mode", &ip, c);
        match (item.get("fieldRef").filter(|f| f.is_object()), item.get("resourceFieldRef").filter(|f| f.is_object())) {
            (Some(_), Some(_)) => c.push(Cause::invalid(
                &ip,
                "Invalid value: \"\": fieldRef and resourceFieldRef can not be specified simultaneously",
            )),
            (None, None) => c.push(Cause::required(join(&ip, "fieldRef"))),
            (Some(f), None) => {
                let fp = format!("{ip}.fieldRef.fieldPath");
                match str_of(f, "fieldPath") {
                    None | Some("") => c.push(Cause::required(fp)),
                    Some(path) => {
                        let key_of = |pre: &str| path.strip_prefix(pre).and_then(|k| k.strip_suffix("']"));
                        let keyed = ["metadata.labels['", "metadata.annotations['"]
                            .iter()
                            .any(|pre| key_of(pre).is_some_and(|k| !k.is_empty()));
                        if !keyed && !VOLUME_FIELD_PATHS.contains(&path) {
                            c.push(unsupported(fp, path, VOLUME_FIELD_PATHS));
                        }
                    }
                }
            }
            (None, Some(r)) => {
                let rp = format!("{ip}.resourceFieldRef");
                if str_of(r, "containerName").is_none_or(str::is_empty) {
                    c.push(Cause::required(join(&rp, "containerName")));
                }
                match str_of(r, "resource") {
                    None | Some("") => c.push(Cause::required(join(&rp, "resource"))),
                    Some(res) if !VOLUME_RESOURCES.contains(&res) => {
                        c.push(unsupported(join(&rp, "resource"), res, VOLUME_RESOURCES));
                    }
                    Some(_) => {}
                }
            }
        }
    }
}

fn check_named_ref(v: &Value, name_key: &str, p: &str, c: &mut Vec<Cause>) {
    if str_of(v, name_key).is_none_or(str::is_empty) {
        c.push(Cause::required(join(p, name_key)));
    }
}

fn validate_source(kind: &str, v: &Value, p: &str, c: &mut Vec<Cause>) {
    if !v.is_object() {
        return;
    }
    match kind {
        "emptyDir" => {
            match str_of(v, "medium").unwrap_or("") {
                "" | "Memory" => {}
                other => c.push(unsupported(join(p, "medium"), other, &["", "Memory"])),
            }
            if let Some(q) = v.get("sizeLimit").and_then(quantity::text)
                && !Quantity::parse(&q).is_ok_and(|q| !q.is_negative())
            {
                c.push(invalid(join(p, "sizeLimit"), &q, "must be a non-negative quantity"));
            }
        }
        "configMap" | "secret" => {
            let name_key = if kind == "secret" { "secretName" } else { "name" };
            check_named_ref(v, name_key, p, c);
            check_items(v, p, c);
            check_mode(v, "defaultMode", p, c);
        }
        "downwardAPI" => {
            check_downward_items(v, p, c);
            check_mode(v, "defaultMode", p, c);
        }
        "hostPath" => {
            match str_of(v, "path").filter(|s| !s.is_empty()) {
                None => c.push(Cause::required(join(p, "path"))),
                Some(path) if path.split('/').any(|part| part == "..") => {
                    c.push(invalid(join(p, "path"), path, "must not contain '..'"))
                }
                Some(_) => {}
            }
            let ty = str_of(v, "type").unwrap_or("");
            if !HOST_PATH_TYPES.contains(&ty) {
                c.push(unsupported(join(p, "type"), ty, HOST_PATH_TYPES));
            }
        }
        "projected" => {
            check_mode(v, "defaultMode", p, c);
            let mut paths = BTreeSet::new();
            for (i, s) in v.get("sources").and_then(Value::as_array).into_iter().flatten().enumerate() {
                let sp = format!("{p}.sources[{i}]");
                refuse_other_fields(s, &["configMap", "secret", "downwardAPI", "serviceAccountToken"], &sp, c);
                let given = objects_in(s, &["configMap", "secret", "downwardAPI", "serviceAccountToken"]);
                if given.len() > 1 {
                    c.push(Cause::forbidden(&sp, "may not specify more than 1 volume type per source"));
                }
                for k in given {
                    let kp = join(&sp, k);
                    let src = &s[k];
                    if k == "serviceAccountToken" {
                        check_token_projection(src, &kp, &mut paths, c);
                    } else if k == "downwardAPI" {
                        check_downward_items(src, &kp, c);
                    } else {
                        check_named_ref(src, "name", &kp, c);
                        check_items(src, &kp, c);
                    }
                    for item in src.get("items").and_then(Value::as_array).into_iter().flatten() {
                        if let Some(path) = str_of(item, "path")
                            && !paths.insert(path.to_string())
                        {
                            c.push(invalid(&kp, path, "conflicting duplicate paths"));
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

/// A projected `serviceAccountToken`: a file path, and a lifetime of 10 minutes to 2^32 seconds.
fn check_token_projection(v: &Value, p: &str, paths: &mut BTreeSet<String>, c: &mut Vec<Cause>) {
    match str_of(v, "path").filter(|s| !s.is_empty()) {
        None => c.push(Cause::required(join(p, "path"))),
        Some(path) => {
            check_descending_path(path, &join(p, "path"), c);
            if !paths.insert(path.to_string()) {
                c.push(invalid(p, path, "conflicting duplicate paths"));
            }
        }
    }
    match v.get("expirationSeconds") {
        None | Some(Value::Null) => {}
        Some(s) => match s.as_i64() {
            Some(n) if n < 600 => c.push(Cause::invalid(
                join(p, "expirationSeconds"),
                format!("Invalid value: {n}: may not specify a duration less than 10 minutes"),
            )),
            Some(n) if n > 1 << 32 => c.push(Cause::invalid(
                join(p, "expirationSeconds"),
                format!("Invalid value: {n}: may not specify a duration larger than 2^32 seconds"),
            )),
            Some(_) => {}
            None => c.push(Cause::invalid(join(p, "expirationSeconds"), format!("Invalid value: {s}: must be an integer"))),
        },
    }
}

/// `spec.volumes`: names unique DNS labels, one implemented source each. Returns the names.
pub(crate) fn validate_volumes(spec: &Value, p: &str, c: &mut Vec<Cause>) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let Some(Value::Array(volumes)) = spec.get("volumes") else { return names };
    for (i, vol) in volumes.iter().enumerate() {
        let vp = format!("{p}.volumes[{i}]");
        let Some(obj) = vol.as_object() else { continue };
        match str_of(vol, "name").filter(|n| !n.is_empty()) {
            None => c.push(Cause::required(join(&vp, "name"))),
            Some(n) if !is_dns1123_label(n) => c.push(invalid(join(&vp, "name"), n, DNS1123_LABEL_RULE)),
            Some(n) if !names.insert(n.to_string()) => {
                c.push(Cause::new("FieldValueDuplicate", join(&vp, "name"), format!("Duplicate value: {}", quoted(n))));
            }
            Some(_) => {}
        }
        let sources: Vec<&String> = obj.iter().filter(|(k, v)| *k != "name" && !v.is_null()).map(|(k, _)| k).collect();
        let mut known = 0;
        for k in &sources {
            if SOURCES.contains(&k.as_str()) {
                known += 1;
                validate_source(k, &obj[k.as_str()], &join(&vp, k), c);
            } else {
                c.push(Cause::forbidden(join(&vp, k), NOT_SUPPORTED));
            }
        }
        if sources.is_empty() {
            c.push(Cause::required(format!("{vp}: must specify a volume type")));
        } else if known > 1 {
            c.push(Cause::forbidden(&vp, "may not specify more than 1 volume type"));
        }
    }
    names
}

/// `containers[].volumeMounts`: each names a volume of the pod, at a unique absolute path.
pub(crate) fn validate_volume_mounts(ct: &Value, p: &str, volumes: &BTreeSet<String>, c: &mut Vec<Cause>) {
    let Some(Value::Array(mounts)) = ct.get("volumeMounts") else { return };
    let mut paths = BTreeSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let mp = format!("{p}.volumeMounts[{i}]");
        if !m.is_object() {
            continue;
        }
        match str_of(m, "name").filter(|n| !n.is_empty()) {
            None => c.push(Cause::required(join(&mp, "name"))),
            Some(n) if !volumes.contains(n) => {
                c.push(Cause::new("FieldValueNotFound", join(&mp, "name"), format!("Not found: {}", quoted(n))));
            }
            Some(_) => {}
        }
        match str_of(m, "mountPath").filter(|s| !s.is_empty()) {
            None => c.push(Cause::required(join(&mp, "mountPath"))),
            Some(path) => {
                if !path.starts_with('/') {
                    c.push(invalid(join(&mp, "mountPath"), path, "must be an absolute path"));
                } else if !paths.insert(path.trim_end_matches('/').to_string()) {
                    c.push(invalid(join(&mp, "mountPath"), path, "must be unique"));
                }
            }
        }
        if let Some(sub) = str_of(m, "subPath").filter(|s| !s.is_empty()) {
            check_descending_path(sub, &join(&mp, "subPath"), c);
        }
        refuse_other_fields(m, &["name", "mountPath", "subPath", "readOnly"], &mp, c);
        if m.get("mountPropagation").and_then(Value::as_str) == Some("None") {
            // "None" is the default kubectl may echo back; only the others ask for something.
            c.retain(|cause| cause.field != join(&mp, "mountPropagation"));
        }
    }
}

/// `env[].valueFrom.configMapKeyRef` / `secretKeyRef`: a name and a valid key.
pub(crate) fn validate_key_ref(from: &Value, vp: &str, c: &mut Vec<Cause>) {
    for kind in ["configMapKeyRef", "secretKeyRef"] {
        let Some(r) = from.get(kind).filter(|r| r.is_object()) else { continue };
        let rp = join(vp, kind);
        check_named_ref(r, "name", &rp, c);
        match str_of(r, "key") {
            None | Some("") => c.push(Cause::required(join(&rp, "key"))),
            Some(k) if !is_config_key(k) => c.push(invalid(join(&rp, "key"), k, KEY_RULE)),
            Some(_) => {}
        }
    }
}

/// `envFrom`: one source per entry, with a name; a prefix that makes valid variable names.
pub(crate) fn validate_env_from(ct: &Value, p: &str, c: &mut Vec<Cause>) {
    let Some(Value::Array(list)) = ct.get("envFrom") else { return };
    for (i, e) in list.iter().enumerate() {
        let ep = format!("{p}.envFrom[{i}]");
        let Some(obj) = e.as_object() else { continue };
        match objects_in(e, &["configMapRef", "secretRef"]).as_slice() {
            [] => c.push(invalid(&ep, "", "must specify one of: `configMapRef` or `secretRef`")),
            [one] => check_named_ref(&obj[*one], "name", &join(&ep, one), c),
            _ => c.push(invalid(&ep, "", "may not have more than one field specified at a time")),
        }
        if let Some(prefix) = str_of(e, "prefix").filter(|s| !s.is_empty())
            && !is_env_var_name(prefix)
        {
            c.push(invalid(join(&ep, "prefix"), prefix, ENV_NAME_RULE));
        }
    }
}

/// Kubernetes' volume defaults: mode 0644 for files of configMap, secret, downwardAPI and
/// projected volumes, an empty hostPath type.
pub(crate) fn default_volumes(spec: &mut Map<String, Value>) {
    let Some(Value::Array(volumes)) = spec.get_mut("volumes") else { return };
    for vol in volumes.iter_mut().filter_map(Value::as_object_mut) {
        for kind in ["configMap", "secret", "downwardAPI", "projected"] {
            if let Some(Value::Object(src)) = vol.get_mut(kind) {
                src.entry("defaultMode").or_insert(Value::from(0o644));
            }
        }
        if let Some(Value::Object(hp)) = vol.get_mut("hostPath") {
            hp.entry("type").or_insert(Value::from(""));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn volume_causes(spec: Value) -> Vec<String> {
        let mut c = Vec::new();
        let names = validate_volumes(&spec, "spec", &mut c);
        for (i, ct) in spec["containers"].as_array().into_iter().flatten().enumerate() {
            validate_volume_mounts(ct, &format!("spec.containers[{i}]"), &names, &mut c);
        }
        c.into_iter().map(|c| format!("{}: {}", c.field, c.message)).collect()
    }

    #[test]
    fn every_implemented_volume_type_is_accepted() {
        let spec = json!({"volumes": [
            {"name": "scratch", "emptyDir": {}},
            {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "counted", "emptyDir": {"sizeLimit": 1048576}},
            {"name": "conf", "configMap": {"name": "app", "items": [{"key": "a", "path": "dir/a.txt", "mode": 0o400}], "defaultMode": 0o644}},
            {"name": "creds", "secret": {"secretName": "db", "optional": true}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory"}}]}},
            {"name": "all", "projected": {"sources": [{"configMap": {"name": "app"}}, {"secret": {"name": "db"}},
                {"serviceAccountToken": {"path": "token", "audience": "vault", "expirationSeconds": 3607}}]}},
            {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
        ], "containers": [{"name": "c", "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"}, {"name": "conf", "mountPath": "/etc/app.conf", "subPath": "dir/a.txt", "readOnly": true}]}]});
        assert_eq!(volume_causes(spec), Vec::<String>::new());
    }

    #[test]
    fn bad_volumes_and_mounts_are_refused_naming_the_field() {
        let spec = json!({"volumes": [
            {"name": "data", "emptyDir": {}},
            {"name": "data", "emptyDir": {}},
            {"name": "claim", "persistentVolumeClaim": {"claimName": "c"}},
            {"name": "host", "hostPath": {"path": "/x", "type": "Pipe"}},
            {"name": "cm", "configMap": {"items": [{"key": "a", "path": "../a"}], "defaultMode": 0o1777}},
            {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"expirationSeconds": 60}},
                {"clusterTrustBundle": {"path": "b"}}]}},
            {"name": "neg", "emptyDir": {"sizeLimit": -5}},
            {"name": "negs", "emptyDir": {"sizeLimit": "-5Mi"}},
        ], "containers": [{"name": "c", "volumeMounts": [
            {"name": "nope", "mountPath": "/a"},
            {"name": "data", "mountPath": "relative"},
            {"name": "data", "mountPath": "/b", "subPath": "../up"},
            {"name": "data", "mountPath": "/c", "subPath": "/abs"},
            {"name": "data", "mountPath": "/d", "subPathExpr": "$(POD)"},
            {"name": "data", "mountPath": "/b"},
        ]}]});
        let got = volume_causes(spec);
        for want in [
            "spec.volumes[1].name: Duplicate value: \"data\"",
            "spec.volumes[2].persistentVolumeClaim: not supported by Shepherd",
            "spec.volumes[3].hostPath.type: Unsupported value: \"Pipe\"",
            "spec.volumes[4].configMap.name: Required value",
            "spec.volumes[4].configMap.items[0].path: Invalid value: \"../a\": must not contain '..'",
            "spec.volumes[4].configMap.defaultMode: Invalid value: 1023: must be a number between 0 and 0777",
            "spec.volumes[5].projected.sources[0].serviceAccountToken.path: Required value",
            "spec.volumes[5].projected.sources[0].serviceAccountToken.expirationSeconds: Invalid value: 60: may not \
             specify a duration less than 10 minutes",
            "spec.volumes[5].projected.sources[1].clusterTrustBundle: not supported by Shepherd",
            "spec.volumes[6].emptyDir.sizeLimit: Invalid value: \"-5\": must be a non-negative quantity",
            "spec.volumes[7].emptyDir.sizeLimit: Invalid value: \"-5Mi\": must be a non-negative quantity",
            "spec.containers[0].volumeMounts[0].name: Not found: \"nope\"",
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"relative\": must be an absolute path",
            "spec.containers[0].volumeMounts[2].subPath: Invalid value: \"../up\": must not contain '..'",
            "spec.containers[0].volumeMounts[3].subPath: Invalid value: \"/abs\": must be a relative path",
            "spec.containers[0].volumeMounts[4].subPathExpr: not supported by Shepherd",
            "spec.containers[0].volumeMounts[5].mountPath: Invalid value: \"/b\": must be unique",
        ] {
            assert!(got.iter().any(|g| g.starts_with(want)), "missing {want:?} in {got:#?}");
        }
    }

    #[test]
    fn env_from_and_key_refs_need_a_source_and_a_name() {
        let mut c = Vec::new();
        let ct = json!({"envFrom": [{"configMapRef": {"name": "app"}, "prefix": "APP_"}, {}, {"secretRef": {}}, {"configMapRef": {"name": "a"}, "prefix": "1x"}]});
        validate_env_from(&ct, "spec.containers[0]", &mut c);
        validate_key_ref(&json!({"secretKeyRef": {"name": "db", "key": "../x"}}), "v", &mut c);
        let got: Vec<String> = c.iter().map(|c| c.field.clone()).collect();
        assert_eq!(got, ["spec.containers[0].envFrom[1]", "spec.containers[0].envFrom[2].secretRef.name",
            "spec.containers[0].envFrom[3].prefix", "v.secretKeyRef.key"]);
    }

    #[test]
    fn environment_variable_names_follow_kubernetes() {
        assert!(is_env_var_name("A_1") && is_env_var_name("my.var-x") && is_env_var_name("_X"));
        assert!(!is_env_var_name("1A") && !is_env_var_name("") && !is_env_var_name("A B") && !is_env_var_name("A=B"));
    }
}
