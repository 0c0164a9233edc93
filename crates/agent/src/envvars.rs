//! A container's environment as kubelet builds it: each `env` entry in order, a `value` with its
//! `$(VAR)` references to earlier entries expanded, a `valueFrom` read through the downward API
//! (`fieldRef`, `resourceFieldRef`); and the same expansion applied to `command` and `args`.

use std::collections::HashMap;

use serde_json::Value;
use shepherd_api::{JsonPath, str_at};

use crate::quantity;
use crate::sources::{SourceError, SourceKind, Sources};

/// What the downward API needs to know of the node a pod runs on.
pub(crate) struct Node<'a> {
    pub ip: &'a str,
    /// The pod's own address when it has a network of its own; `None`: it shares the node's.
    pub pod_ip: Option<&'a str>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

/// This host's cpu count (in millicores) and memory: what a container without a limit may use.
/// Read once per process, as kubelet reads its machine's capacity at start: the cpu count looks
/// through cgroup files, and with /proc/meminfo that was most of a simulated container's start.
pub(crate) fn host_allocatable() -> (u64, u64) {
    static HOST: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(0, |kib| kib * 1024);
        (cpus * 1000, memory)
    })
}

/// A container's environment, and the envFrom keys skipped because they are not valid variable
/// names (kubelet reports those in an Event and starts the container anyway).
#[derive(Debug, Default)]
pub(crate) struct Environment {
    pub vars: Vec<(String, String)>,
    /// `Keys [..] from the EnvFrom configMap ns/name were skipped ...`, one line per source.
    pub skipped: Vec<String>,
}

fn set(env: &mut Vec<(String, String)>, name: &str, value: String) {
    env.retain(|(k, _)| k != name);
    env.push((name.to_string(), value));
}

/// Prepends the variables kubelet gives every container for the API server's `kubernetes` Service
/// (reached here at `host:port`), keeping any the container sets itself.
pub(crate) fn add_kubernetes_service(vars: &mut Vec<(String, String)>, host: &str, port: u16) {
    let url = format!("tcp://{host}:{port}");
    let service = [
        ("KUBERNETES_SERVICE_HOST".to_string(), host.to_string()),
        ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), port.to_string()),
        ("KUBERNETES_PORT".to_string(), url.clone()),
        (format!("KUBERNETES_PORT_{port}_TCP"), url),
        (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host.to_string()),
    ];
    let missing: Vec<(String, String)> = service.into_iter().filter(|(k, _)| !vars.iter().any(|(n, _)| n == k)).collect();
    vars.splice(0..0, missing);
}

/// The environment of `container` (an entry of the pod's `containers`) as kubelet builds it:
/// `envFrom` sources first, then `env` in order (a later name replaces an earlier one). A
/// ConfigMap or Secret that is missing (and not optional) is an error: the container waits.
pub(crate) fn container_env(
    pod: &Value,
    container: &Value,
    node: &Node,
    sources: &Sources,
) -> Result<Environment, SourceError> {
    let namespace = str_at(pod, "/metadata/namespace");
    let mut out = Environment::default();
    for from in container.get("envFrom").and_then(Value::as_array).into_iter().flatten() {
        let object = |key: &str| from.get(key).filter(|r| r.is_object());
        let (kind, r) = match (object("configMapRef"), object("secretRef")) {
            (Some(r), _) => (SourceKind::ConfigMap, r),
            (None, Some(r)) => (SourceKind::Secret, r),
            (None, None) => continue,
        };
        let name = str_at(r, "/name");
        let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
        let prefix = from.get("prefix").and_then(Value::as_str).unwrap_or("");
        let mut invalid = Vec::new();
        for (key, value) in sources.require(kind, namespace, name, optional)? {
            let var = format!("{prefix}{key}");
            if shepherd_api::is_env_var_name(&var) {
                set(&mut out.vars, &var, String::from_utf8_lossy(&value).into_owned());
            } else {
                invalid.push(var);
            }
        }
        if !invalid.is_empty() {
            out.skipped.push(format!(
                "Keys [{}] from the EnvFrom {} {namespace}/{name} were skipped since they are considered invalid \
                 environment variable names.",
                invalid.join(", "),
                kind.word()
            ));
        }
    }
    for e in container.get("env").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = e.get("name").and_then(Value::as_str) else { continue };
        let value = match e.get("valueFrom").filter(|v| v.is_object()) {
            Some(from) => match (from.get("configMapKeyRef"), from.get("secretKeyRef")) {
                (Some(r), _) if r.is_object() => match sources.key(SourceKind::ConfigMap, namespace, r)? {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None => continue,
                },
                (_, Some(r)) if r.is_object() => match sources.key(SourceKind::Secret, namespace, r)? {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None => continue,
                },
                _ => downward(pod, container, from, node),
            },
            None => {
                let vars: HashMap<&str, &str> = out.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                expand(e.get("value").and_then(Value::as_str).unwrap_or(""), &vars)
            }
        };
        set(&mut out.vars, name, value);
    }
    Ok(out)
}

/// `command` or `args` with `$(VAR)` references to the container's environment expanded.
pub(crate) fn expand_all(words: Vec<String>, env: &[(String, String)]) -> Vec<String> {
    let vars: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    words.iter().map(|w| expand(w, &vars)).collect()
}

/// Kubernetes' expansion: `$(NAME)` becomes the variable's value when it is defined and stays as
/// written when it is not; `$$` is a literal `$`.
pub(crate) fn expand(s: &str, vars: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}


fn downward(pod: &Value, container: &Value, from: &Value, node: &Node) -> String {
    if let Some(field) = from.get("fieldRef") {
        return field_value(pod, str_at(field, "/fieldPath"), node);
    }
    if let Some(res) = from.get("resourceFieldRef") {
        let name = str_at(res, "/containerName");
        let target = if name.is_empty() {
            Some(container)
        } else {
            pod.at("/spec/containers").and_then(Value::as_array).and_then(|cs| cs.iter().find(|c| c["name"] == name))
        };
        return target.map(|c| resource_value(c, res, node)).unwrap_or_default();
    }
    String::new()
}

pub(crate) fn field_value(pod: &Value, path: &str, node: &Node) -> String {
    let keyed = |prefix: &str| path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']"));
    if let Some(key) = keyed("metadata.labels['") {
        return pod.at("/metadata/labels").and_then(|l| l.get(key)).and_then(Value::as_str).unwrap_or("").into();
    }
    if let Some(key) = keyed("metadata.annotations['") {
        return pod.at("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str).unwrap_or("").into();
    }
    match path {
        "metadata.name" => str_at(pod, "/metadata/name").into(),
        "metadata.namespace" => str_at(pod, "/metadata/namespace").into(),
        "metadata.uid" => str_at(pod, "/metadata/uid").into(),
        "spec.nodeName" => str_at(pod, "/spec/nodeName").into(),
        "spec.serviceAccountName" => str_at(pod, "/spec/serviceAccountName").into(),
        "status.hostIP" | "status.hostIPs" => node.ip.into(),
        // A pod sharing its node's network has the node's address.
        "status.podIP" | "status.podIPs" => node.pod_ip.unwrap_or(node.ip).into(),
        _ => String::new(),
    }
}

/// A resource of a container in units of the divisor, rounded up as kubelet does; a limit that is
/// not set reads as the node's allocatable amount, a request that is not set as zero.
pub(crate) fn resource_value(container: &Value, res: &Value, node: &Node) -> String {
    let resource = str_at(res, "/resource");
    let (kind, name) = resource.split_once('.').unwrap_or(("", ""));
    let set = container.at(&format!("/resources/{kind}/{name}")).and_then(quantity::text);
    let divisor = res.get("divisor").and_then(quantity::text);
    let value = match name {
        "cpu" => {
            let millis = set.and_then(|q| quantity::millicores(&q)).or((kind == "limits").then_some(node.cpu_millis)).unwrap_or(0);
            let per = divisor.and_then(|d| quantity::millicores(&d)).filter(|d| *d > 0).unwrap_or(1000);
            millis.div_ceil(per)
        }
        "memory" | "ephemeral-storage" => {
            let fallback = (kind == "limits" && name == "memory").then_some(node.memory_bytes);
            let bytes = set.and_then(|q| quantity::bytes(&q)).or(fallback).unwrap_or(0);
            let per = divisor.and_then(|d| quantity::bytes(&d)).filter(|d| *d > 0).unwrap_or(1);
            bytes.div_ceil(per)
        }
        _ => return String::new(),
    };
    value.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn containers_get_the_api_servers_address_unless_they_set_it_themselves() {
        let mut vars = vec![("KUBERNETES_SERVICE_PORT".to_string(), "1".to_string()), ("A".to_string(), "b".to_string())];
        add_kubernetes_service(&mut vars, "127.0.0.1", 9876);
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("127.0.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("1"), "the container's own value stays");
        assert_eq!(get("KUBERNETES_PORT_9876_TCP"), Some("tcp://127.0.0.1:9876"));
        assert_eq!(vars.last().map(|(k, _)| k.as_str()), Some("A"), "the pod's own variables come after");
    }

    use serde_json::json;

    use super::*;

    const NODE: Node = Node { ip: "10.0.0.7", pod_ip: None, cpu_millis: 2000, memory_bytes: 8 << 30 };

    #[test]
    fn references_expand_like_kubelet_expands_them() {
        let vars: HashMap<&str, &str> = [("A", "1"), ("B", "two")].into();
        assert_eq!(expand("$(A)-$(B)", &vars), "1-two");
        assert_eq!(expand("$(MISSING) stays", &vars), "$(MISSING) stays");
        assert_eq!(expand("$$(A) is escaped, $5 is not a reference", &vars), "$(A) is escaped, $5 is not a reference");
        assert_eq!(expand("$(A", &vars), "$(A");
    }

    #[test]
    fn a_pod_with_its_own_network_reads_its_own_address_as_pod_ip_and_the_nodes_as_host_ip() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]}]}});
        let node = Node { pod_ip: Some("10.244.1.5"), ..NODE };
        let env = container_env(&pod, &pod["spec"]["containers"][0], &node, &Sources::fixed(Vec::new())).expect("env").vars;
        let got: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!((got["POD_IP"], got["HOST_IP"]), ("10.244.1.5", "10.0.0.7"));
    }

    #[test]
    fn the_downward_api_fills_fields_and_resources() {
        let pod = json!({"metadata": {"name": "web-0", "namespace": "shop", "uid": "u-1", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "bot", "containers": [
                {"name": "c", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}, "env": [
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hi $(POD) in $(NS)"},
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                    {"name": "CPU_M", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
                    {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                    {"name": "REQ_MEM", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
                ]},
                {"name": "other"}]}});
        let none = Sources::fixed(Vec::new());
        let env = container_env(&pod, &pod["spec"]["containers"][0], &NODE, &none).expect("env").vars;
        let got: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got["POD"], "web-0");
        assert_eq!(got["GREETING"], "hi web-0 in $(NS)", "only earlier variables expand");
        assert_eq!((got["NS"], got["APP"], got["IP"]), ("shop", "web", "10.0.0.7"));
        assert_eq!((got["CPU"], got["CPU_M"], got["MEM_MI"], got["REQ_MEM"]), ("1", "500", "64", "0"));

        let other = json!({"name": "other", "env": [{"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}]});
        let vars = container_env(&pod, &other, &NODE, &none).expect("env").vars;
        assert_eq!(vars, [("CPU".to_string(), "2".to_string())], "no limit: the node's");
        assert_eq!(expand_all(vec!["echo".into(), "$(POD)".into()], &env), ["echo", "web-0"]);
    }

    #[test]
    fn config_maps_and_secrets_fill_the_environment_env_winning_over_env_from() {
        let sources = Sources::fixed(vec![
            (SourceKind::ConfigMap, "shop/app", json!({"data": {"a": "1", "mode": "fast", "1bad": "x"}})),
            (SourceKind::Secret, "shop/db", json!({"data": {"password": "czNjcmV0"}})),
        ]);
        let pod = json!({"metadata": {"name": "p", "namespace": "shop"}, "spec": {"containers": []}});
        let ct = json!({"name": "c",
            "envFrom": [{"configMapRef": {"name": "app"}}, {"secretRef": {"name": "db"}, "prefix": "DB_"},
                {"configMapRef": {"name": "absent", "optional": true}}],
            "env": [{"name": "mode", "value": "slow"},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}}]});
        let env = container_env(&pod, &ct, &NODE, &sources).expect("env");
        let got: HashMap<&str, &str> = env.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!((got["a"], got["mode"], got["DB_password"], got["PW"]), ("1", "slow", "s3cret", "s3cret"));
        assert!(!got.contains_key("OPT") && !got.contains_key("1bad"), "{got:?}");
        assert_eq!(env.skipped.len(), 1);
        assert!(env.skipped[0].contains("[1bad]") && env.skipped[0].contains("configmap shop/app"), "{:?}", env.skipped);

        let missing = json!({"name": "c", "envFrom": [{"configMapRef": {"name": "later"}}]});
        let err = container_env(&pod, &missing, &NODE, &sources).expect_err("missing");
        assert_eq!(err.to_string(), "configmap \"later\" not found");
        let key = json!({"name": "c", "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "zz"}}}]});
        let err = container_env(&pod, &key, &NODE, &sources).expect_err("missing key");
        assert_eq!(err.to_string(), "couldn't find key zz in ConfigMap shop/app");
    }
}
