//! Server-side apply and field ownership (`metadata.managedFields`), as Kubernetes defines them.
//!
//! Every write records who set which fields: an apply (`application/apply-patch+yaml`) owns exactly
//! the fields of its configuration under an `Apply` entry; any other write takes the fields it
//! changed under an `Update` entry. An apply that would change a field another manager owns is a
//! 409 naming both, unless forced; fields an applier stops applying are removed unless someone
//! else owns them. How fields merge (keyed lists, sets, atomic values) comes from the schema.

mod fieldpath;
mod managed;
mod schema;
mod typed;

use std::sync::OnceLock;

use serde_json::{Value, json};
use shepherd_api::kinds::ResourceInfo;
use shepherd_api::{ApiError, Cause};

use fieldpath::{PathElement, Set, path_string};
use managed::{Entry, Operation};
use schema::Schema;

/// kubectl's client-side apply keeps the configuration it applied in this annotation.
pub(crate) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The manager of the fields an object had before its first apply, when nothing recorded owners.
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// kubectl's server-side apply manager. Kubernetes gives it two rules for moving from client-side
/// apply: it keeps the last-applied annotation in step, and it may take fields whose value is the
/// one the annotation recorded without a conflict.
const KUBECTL: &str = "kubectl";

/// Kubernetes' limit on a field manager's name.
pub(crate) const FIELD_MANAGER_MAX_LENGTH: usize = 128;

/// Who writes, and through which subresource (`""` for the object itself).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub(crate) manager: &'a str,
    pub(crate) subresource: &'a str,
}

/// The manager Kubernetes assumes when a request names none: its User-Agent up to the first `/`,
/// printable characters only, at most 128 bytes (`kubectl/v1.33.0 (linux/amd64)` is `kubectl`).
pub(crate) fn manager_from_user_agent(user_agent: &str) -> String {
    let mut out = String::new();
    for c in user_agent.split('/').next().unwrap_or("").chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX_LENGTH {
            break;
        }
        out.push(c);
    }
    out
}

fn f(name: &str) -> PathElement {
    PathElement::Field(name.into())
}

/// Fields the server sets, which no manager owns (Kubernetes strips the same ones), and `status`.
fn server_owned() -> &'static (Set, Set, Set) {
    static SETS: OnceLock<(Set, Set, Set)> = OnceLock::new();
    SETS.get_or_init(|| {
        let mut plain = Set::new();
        for p in [vec![f("apiVersion")], vec![f("kind")], vec![f("metadata")]] {
            plain.insert(&p);
        }
        let mut recursive = Set::new();
        for field in ["name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields",
            "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"]
        {
            recursive.insert(&[f("metadata"), f(field)]);
        }
        let mut status = Set::new();
        status.insert(&[f("status")]);
        (plain, recursive, status)
    })
}

/// The part of `set` a write through `subresource` can own: not the server's fields; not status
/// through the main resource of a kind with a status subresource; only status through `/status`.
fn scope(res: &ResourceInfo, subresource: &str, mut set: Set) -> Set {
    let (plain, recursive, status) = server_owned();
    set.remove(plain);
    set.remove_recursive(recursive);
    match subresource {
        "" if res.has_status => {
            set.remove_recursive(status);
            set
        }
        "status" => set.restricted_to(&f("status")),
        _ => set,
    }
}

fn without_managed_fields(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
    }
    o
}

fn now() -> String {
    crate::service::now_rfc3339()
}

/// Records a create, update or patch (not an apply) that turned `old` (`None` for a create) into
/// `new`: the writer takes the fields it added or changed, others lose those and the removed ones.
/// A client may set `managedFields` itself (kubectl does, to move client-side ownership to its
/// server-side apply manager); otherwise they are carried over from `old`.
pub(crate) fn record_update(res: &ResourceInfo, old: Option<&Value>, new: &mut Value, w: Writer) {
    let schema = Schema::get();
    let ty = Schema::root(res);
    let api_version = res.api_version();
    let old_fields = old.and_then(|o| o.get("metadata")).and_then(|m| m.get("managedFields"));
    // Neither object is copied without its managedFields (the comparison skips them): every path
    // below either writes `new`'s anew or puts the old ones back, and the copies were a visible
    // part of each Lease renewal's cost.
    let new_fields = new.get_mut("metadata").and_then(Value::as_object_mut).and_then(|m| m.remove("managedFields"));
    let set_by_client = w.subresource.is_empty()
        && new_fields.as_ref().and_then(Value::as_array).is_some_and(|a| !a.is_empty())
        && new_fields.as_ref() != old_fields;
    let from_old = || old.map(managed::decode).unwrap_or(Ok(Vec::new())).unwrap_or_default();
    let mut entries = match new_fields {
        // The client's text is read, and written again in the server's form.
        Some(fields) if set_by_client => managed::decode_list(&fields).unwrap_or_else(|_| from_old()),
        // The stored entries, carried over in `new` as they are: their text is the server's own.
        Some(fields) if Some(&fields) == old_fields => managed::decode_stored(fields),
        _ => from_old(),
    };
    if entries.is_empty() && old.is_some() {
        // An object that never had owners recorded keeps none until it is applied (Kubernetes).
        return;
    }
    let typed::Comparison { added, removed, modified } = typed::compare(schema, &ty, old.unwrap_or(&json!({})), new);
    let mut changed = added;
    changed.absorb(&modified);
    let taken = scope(res, w.subresource, changed);
    if taken.is_empty() && removed.is_empty() && !set_by_client {
        if let (Some(m), Some(fields)) = (new.get_mut("metadata").and_then(Value::as_object_mut), old_fields) {
            m.insert("managedFields".into(), fields.clone());
        }
        return;
    }
    for e in &mut entries {
        if e.set.remove(&taken) | e.set.remove(&removed) {
            e.written = None;
        }
    }
    if !taken.is_empty() {
        match entries.iter_mut().find(|e| e.is(w.manager, Operation::Update, w.subresource, &api_version)) {
            Some(e) => {
                e.set.absorb(&taken);
                e.time = Some(now());
                e.written = None;
            }
            None => entries.push(Entry {
                manager: w.manager.to_string(),
                operation: Operation::Update,
                api_version,
                time: Some(now()),
                subresource: w.subresource.to_string(),
                set: taken,
                written: None,
            }),
        }
    }
    managed::encode(new, entries);
}

/// The configuration an apply through `subresource` may set: the main resource of a kind with a
/// status subresource ignores status, `/status` ignores all but status.
fn applicable(res: &ResourceInfo, subresource: &str, config: &Value) -> Value {
    let mut c = config.clone();
    let Some(o) = c.as_object_mut() else { return c };
    match subresource {
        "" if res.has_status => {
            o.remove("status");
        }
        "status" => o.retain(|k, _| matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")),
        _ => {}
    }
    if subresource == "status"
        && let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut)
    {
        m.retain(|k, _| k == "name" || k == "namespace");
    }
    c
}

/// `config` merged into `live` before anything is pruned: what strict field validation reads, since
/// a configuration alone is often too partial to be read as its kind.
pub(crate) fn merged(res: &ResourceInfo, live: &Value, config: &Value, w: Writer) -> Value {
    let config = applicable(res, w.subresource, config);
    typed::merge(Schema::get(), &Schema::root(res), &without_managed_fields(live), &config)
}

/// Applies `config` for `w` to `live` (an empty object when the apply creates it) and returns the
/// object to store, with its `managedFields`; a change to a field another manager owns is a 409
/// naming each such field, unless `force`.
pub(crate) fn apply(
    res: &ResourceInfo,
    live: &Value,
    config: &Value,
    w: Writer,
    force: bool,
) -> Result<Value, ApiError> {
    let schema = Schema::get();
    let ty = Schema::root(res);
    let api_version = res.api_version();
    let creating = live.get("metadata").and_then(|m| m.get("uid")).is_none();
    let mut entries = managed::decode(live).unwrap_or_default();
    let live_obj = without_managed_fields(live);
    if entries.is_empty() && !creating {
        let c = typed::compare(schema, &ty, &json!({}), &live_obj);
        let set = scope(res, "", c.added);
        if !set.is_empty() {
            entries.push(Entry {
                manager: BEFORE_FIRST_APPLY.into(),
                operation: Operation::Update,
                api_version: api_version.clone(),
                time: Some(now()),
                subresource: String::new(),
                set,
                written: None,
            });
        }
    }
    let config = applicable(res, w.subresource, config);
    let mut merged = typed::merge(schema, &ty, &live_obj, &config);
    let config_set = scope(res, w.subresource, typed::field_set(schema, &ty, &config));
    let (me, last) = match entries.iter().position(|e| e.is(w.manager, Operation::Apply, w.subresource, "")) {
        Some(i) => {
            let last = std::mem::replace(&mut entries[i].set, config_set);
            entries[i].api_version = api_version.clone();
            (i, last)
        }
        None => {
            entries.push(Entry {
                manager: w.manager.to_string(),
                operation: Operation::Apply,
                api_version: api_version.clone(),
                time: None,
                subresource: w.subresource.to_string(),
                set: config_set,
                written: None,
            });
            (entries.len() - 1, Set::new())
        }
    };
    if !last.is_empty() {
        let owned_now = entries.iter().fold(Set::new(), |acc, e| acc.union(&e.set));
        typed::prune(schema, &ty, &mut merged, &last, &owned_now);
    }
    let c = typed::compare(schema, &ty, &live_obj, &merged);
    let changed = scope(res, w.subresource, c.added.union(&c.modified));
    let mut conflicts: Vec<(usize, Set)> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != me)
        .map(|(i, e)| (i, e.set.intersection(&changed)))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    if !conflicts.is_empty() && !force {
        if w.manager == KUBECTL
            && let Some(allowed) = allowed_by_last_applied(res, &live_obj)
        {
            let refused: Vec<(usize, Set)> = conflicts
                .iter()
                .map(|(i, s)| (*i, s.difference(&allowed)))
                .filter(|(_, s)| !s.is_empty())
                .collect();
            if !refused.is_empty() {
                return Err(conflict_error(&entries, &refused));
            }
        } else {
            return Err(conflict_error(&entries, &conflicts));
        }
    }
    for (i, taken) in conflicts.drain(..) {
        entries[i].set.remove(&taken);
    }
    for (i, e) in entries.iter_mut().enumerate() {
        if i != me {
            e.set.remove(&c.removed);
        }
    }
    if merged != live_obj || entries[me].time.is_none() {
        entries[me].time = Some(now());
    }
    if w.manager == KUBECTL && annotation(&live_obj, LAST_APPLIED).is_some() {
        let mut recorded = config.clone();
        if let Some(a) = recorded.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
            a.remove(LAST_APPLIED);
        }
        if let Some(m) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = m.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(LAST_APPLIED.into(), json!(recorded.to_string()));
            }
        }
    }
    managed::encode(&mut merged, entries);
    Ok(merged)
}

fn annotation<'a>(obj: &'a Value, name: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations").and_then(|a| a.get(name)).and_then(Value::as_str)
}

/// The fields a client-side apply recorded in the last-applied annotation and still has as it
/// left them: kubectl's server-side apply takes these over without a conflict.
fn allowed_by_last_applied(res: &ResourceInfo, live: &Value) -> Option<Set> {
    let last: Value = serde_json::from_str(annotation(live, LAST_APPLIED)?).ok()?;
    if !last.is_object() {
        return None;
    }
    let schema = Schema::get();
    let ty = Schema::root(res);
    let set = typed::field_set(schema, &ty, &last);
    let c = typed::compare(schema, &ty, &last, live);
    Some(set.difference(&c.modified))
}

/// The 409 Kubernetes answers: one cause per field, the message naming managers and fields.
fn conflict_error(entries: &[Entry], conflicts: &[(usize, Set)]) -> ApiError {
    let mut by_manager: Vec<(String, Vec<String>)> = conflicts
        .iter()
        .map(|(i, s)| (entries[*i].describe(), s.paths().iter().map(|p| path_string(p)).collect()))
        .collect();
    by_manager.sort();
    let causes: Vec<Cause> = by_manager
        .iter()
        .flat_map(|(who, paths)| {
            paths.iter().map(move |p| Cause::new("FieldManagerConflict", p.clone(), format!("conflict with {who}")))
        })
        .collect();
    let message = match (causes.len(), by_manager.first()) {
        (1, Some((who, paths))) => format!("Apply failed with 1 conflict: conflict with {who}: {}", paths[0]),
        (n, _) => {
            let mut lines = Vec::new();
            for (who, paths) in &by_manager {
                lines.push(format!("conflicts with {who}:"));
                lines.extend(paths.iter().map(|p| format!("- {p}")));
            }
            format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
        }
    };
    ApiError::ApplyConflict { message, causes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_api::kinds;

    fn deployment(replicas: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "x"}]}}}})
    }

    /// A Deployment created by kubectl's client-side apply of `deployment(2)`, then scaled to `replicas`.
    fn client_side_applied(replicas: i64) -> Value {
        let mut created = deployment(2);
        created["metadata"]["uid"] = json!("u1");
        created["metadata"]["annotations"] = json!({LAST_APPLIED: deployment(2).to_string()});
        let csa = Writer { manager: "kubectl-client-side-apply", subresource: "" };
        record_update(&kinds::DEPLOYMENT, None, &mut created, csa);
        let mut scaled = created.clone();
        scaled["spec"]["replicas"] = json!(replicas);
        record_update(&kinds::DEPLOYMENT, Some(&created), &mut scaled, Writer { manager: "hpa", subresource: "" });
        scaled
    }

    fn error_text(r: Result<Value, ApiError>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(v) => panic!("applied: {v}"),
        }
    }

    #[test]
    fn kubectl_takes_over_what_client_side_apply_left_as_it_recorded_it_and_no_one_else_does() {
        let live = client_side_applied(2);
        let kubectl = Writer { manager: KUBECTL, subresource: "" };
        let applied = apply(&kinds::DEPLOYMENT, &live, &deployment(3), kubectl, false).expect("kubectl migrates");
        assert_eq!(applied["spec"]["replicas"], 3);
        let recorded: Value = serde_json::from_str(annotation(&applied, LAST_APPLIED).expect("annotation")).expect("json");
        assert_eq!(recorded["spec"]["replicas"], 3, "the annotation follows kubectl's applies");

        let other = Writer { manager: "ci", subresource: "" };
        let e = error_text(apply(&kinds::DEPLOYMENT, &live, &deployment(3), other, false));
        assert_eq!(e, "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas");
    }

    #[test]
    fn a_field_changed_since_the_client_side_apply_still_conflicts_for_kubectl() {
        let live = client_side_applied(5);
        let kubectl = Writer { manager: KUBECTL, subresource: "" };
        let e = error_text(apply(&kinds::DEPLOYMENT, &live, &deployment(3), kubectl, false));
        assert_eq!(e, "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas");
    }

    #[test]
    fn an_update_that_changes_nothing_keeps_the_entries_as_they_were() {
        let live = client_side_applied(2);
        let mut same = live.clone();
        record_update(&kinds::DEPLOYMENT, Some(&live), &mut same, Writer { manager: "other", subresource: "" });
        assert_eq!(same, live);
    }

    fn lease(renew: &str) -> Value {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "n1", "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40, "renewTime": renew}})
    }

    #[test]
    fn a_lease_renewed_by_its_holder_keeps_one_entry_owning_the_same_fields_and_the_object_as_sent() {
        let agent = Writer { manager: "shepherd-agent", subresource: "" };
        let mut live = lease("2026-01-01T00:00:00.000000Z");
        record_update(&kinds::LEASE, None, &mut live, agent);
        let created = live["metadata"]["managedFields"].clone();
        assert_eq!(created[0]["fieldsV1"], json!({"f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {}, "f:renewTime": {}}}));
        for (i, carries_fields) in [(1, true), (2, false)] {
            // The agent sends back what it read (managedFields included) or only its own fields.
            let mut renewed = lease(&format!("2026-01-01T00:00:{i:02}.000000Z"));
            if carries_fields {
                renewed["metadata"]["managedFields"] = live["metadata"]["managedFields"].clone();
            }
            record_update(&kinds::LEASE, Some(&live), &mut renewed, agent);
            let entries = renewed["metadata"]["managedFields"].as_array().expect("managedFields").clone();
            assert_eq!(entries.len(), 1, "{entries:?}");
            assert_eq!(entries[0]["manager"], "shepherd-agent");
            assert_eq!(entries[0]["operation"], "Update");
            assert_eq!(entries[0]["fieldsV1"], created[0]["fieldsV1"], "the holder owned the renewed field already");
            assert!(entries[0]["time"].as_str().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok()), "{entries:?}");
            let mut sent = renewed.clone();
            sent["metadata"].as_object_mut().expect("metadata").remove("managedFields");
            assert_eq!(sent, lease(&format!("2026-01-01T00:00:{i:02}.000000Z")), "nothing but managedFields is touched");
            live = renewed;
        }

        // Another writer of renewTime takes that field from the holder.
        let mut taken = lease("2026-01-01T00:01:00.000000Z");
        record_update(&kinds::LEASE, Some(&live), &mut taken, Writer { manager: "other", subresource: "" });
        let entries = taken["metadata"]["managedFields"].as_array().expect("managedFields");
        let of = |m: &str| entries.iter().find(|e| e["manager"] == m).map(|e| e["fieldsV1"]["f:spec"].clone());
        assert_eq!(of("other"), Some(json!({"f:renewTime": {}})));
        assert_eq!(of("shepherd-agent"), Some(json!({"f:holderIdentity": {}, "f:leaseDurationSeconds": {}})));
    }

    /// The object with its managedFields decoded and encoded afresh, none of the stored text kept.
    fn encoded_afresh(obj: &Value) -> Value {
        let mut fresh = obj.clone();
        managed::encode(&mut fresh, managed::decode(obj).expect("decode"));
        fresh
    }

    #[test]
    fn entries_written_back_as_stored_are_what_encoding_them_afresh_gives() {
        let rs = Writer { manager: "shepherd-controller-manager", subresource: "" };
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default",
            "uid": "u1", "labels": {"app": "web"}, "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "web", "uid": "u0", "controller": true}]},
            "spec": {"containers": [{"name": "web", "image": "x", "ports": [{"containerPort": 80}]}]}});
        record_update(&kinds::POD, None, &mut pod, rs);
        let steps: Vec<(Writer, Box<dyn Fn(&mut Value)>)> = vec![
            (Writer { manager: "shepherd-scheduler", subresource: "binding" }, Box::new(|p| p["spec"]["nodeName"] = json!("n1"))),
            (Writer { manager: "shepherd-agent", subresource: "status" }, Box::new(|p| {
                p["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]})
            })),
            (Writer { manager: "kubectl-label", subresource: "" }, Box::new(|p| p["metadata"]["labels"]["tier"] = json!("a"))),
            // Takes a field of the first writer, and removes one.
            (Writer { manager: "kubectl-edit", subresource: "" }, Box::new(|p| {
                p["metadata"]["labels"]["app"] = json!("api");
                p["spec"]["containers"][0].as_object_mut().expect("container").remove("ports");
            })),
            (Writer { manager: "shepherd-agent", subresource: "status" }, Box::new(|p| p["status"]["phase"] = json!("Succeeded"))),
            // Nothing changes: the entries stay as they were.
            (Writer { manager: "other", subresource: "" }, Box::new(|_| {})),
        ];
        let mut managers = 1;
        for (w, change) in steps {
            let mut next = pod.clone();
            change(&mut next);
            record_update(&kinds::POD, Some(&pod), &mut next, w);
            assert_eq!(next, encoded_afresh(&next), "after a write by {}", w.manager);
            managers = managers.max(next["metadata"]["managedFields"].as_array().map_or(0, Vec::len));
            pod = next;
        }
        assert_eq!(managers, 5, "{pod}");
        let of = |m: &str| pod["metadata"]["managedFields"].as_array().and_then(|a| a.iter().find(|e| e["manager"] == m)).cloned();
        assert_eq!(of("kubectl-edit").expect("kubectl-edit")["fieldsV1"], json!({"f:metadata": {"f:labels": {"f:app": {}}}}));
        let rs_fields = &of("shepherd-controller-manager").expect("creator")["fieldsV1"];
        assert!(rs_fields["f:metadata"]["f:labels"].get("f:app").is_none(), "{rs_fields}");
        assert!(rs_fields["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"].get("f:ports").is_none(), "{rs_fields}");

        // A client's own managedFields, in a form of its own, are stored in the server's form.
        let mut set = pod.clone();
        set["metadata"]["managedFields"] = json!([{"manager": "mine", "operation": "Update", "apiVersion": "v1",
            "fieldsV1": {"f:spec": {"f:containers": {"k:{\"name\": \"web\"}": {"f:image": {}}}}}}]);
        record_update(&kinds::POD, Some(&pod), &mut set, Writer { manager: "kubectl", subresource: "" });
        assert_eq!(set, encoded_afresh(&set));
        assert_eq!(set["metadata"]["managedFields"][0]["fieldsType"], "FieldsV1");
        assert!(set["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:containers"].get("k:{\"name\":\"web\"}").is_some());
    }

    #[test]
    fn the_manager_named_by_a_user_agent_is_its_first_word() {
        assert_eq!(manager_from_user_agent("kubectl/v1.33.0 (linux/amd64) kubernetes/abc"), "kubectl");
        assert_eq!(manager_from_user_agent("kube-rs/1.0"), "kube-rs");
        assert_eq!(manager_from_user_agent(&"x".repeat(300)).len(), FIELD_MANAGER_MAX_LENGTH);
        assert_eq!(manager_from_user_agent(""), "");
    }
}
