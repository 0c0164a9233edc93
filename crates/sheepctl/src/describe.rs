//! `sheepctl describe`: an object's fields, conditions and events, for a human.

use std::fmt::Write;

use serde_json::Value;
use shepherd_api::kinds::ResourceInfo;
use shepherd_api::str_at;

use crate::apply::LAST_APPLIED;
use crate::connection::Cluster;
use crate::{printer, resource};

pub async fn run(cluster: &Cluster, target: &[String]) -> anyhow::Result<bool> {
    let (res, names) = resource::kind_and_names(target)?;
    let names = if names.is_empty() {
        let list = cluster.get(&resource::collection_path(res, Some(&cluster.namespace))).await?;
        list["items"].as_array().into_iter().flatten()
            .filter_map(|o| o.pointer("/metadata/name").and_then(Value::as_str).map(String::from)).collect()
    } else {
        names
    };
    let mut ok = true;
    for (i, name) in names.iter().enumerate() {
        let obj = match cluster.get(&resource::object_path(res, &cluster.namespace, name)).await {
            Ok(o) => o,
            Err(e) => {
                eprintln!("Error: {e}");
                ok = false;
                continue;
            }
        };
        let events = events_of(cluster, &obj).await?;
        if i > 0 {
            println!();
        }
        print!("{}", describe(res, &obj, &events));
    }
    Ok(ok)
}

/// The events whose `involvedObject` is this object. The server's field selectors do not cover
/// `involvedObject.*`, so the namespace's events are filtered here, by uid when the event has one.
async fn events_of(cluster: &Cluster, obj: &Value) -> anyhow::Result<Vec<Value>> {
    let ns = obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let uid = str_at(obj, "/metadata/uid");
    let name = str_at(obj, "/metadata/name");
    let kind = str_at(obj, "/kind");
    let list = cluster.get(&resource::collection_path(&shepherd_api::kinds::EVENT, Some(ns))).await?;
    let mut events: Vec<Value> = list["items"].as_array().into_iter().flatten()
        .filter(|e| {
            let euid = str_at(e, "/involvedObject/uid");
            if !euid.is_empty() && !uid.is_empty() {
                return euid == uid;
            }
            str_at(e, "/involvedObject/name") == name && (str_at(e, "/involvedObject/kind").is_empty() || str_at(e, "/involvedObject/kind") == kind)
        })
        .cloned()
        .collect();
    events.sort_by_key(|e| last_seen(e).map(|t| t.as_second()).unwrap_or(0));
    Ok(events)
}

fn timestamp(v: &Value, ptr: &str) -> Option<jiff::Timestamp> {
    v.pointer(ptr).and_then(Value::as_str).and_then(|t| t.parse().ok())
}

fn last_seen(e: &Value) -> Option<jiff::Timestamp> {
    timestamp(e, "/lastTimestamp").or_else(|| timestamp(e, "/eventTime")).or_else(|| timestamp(e, "/metadata/creationTimestamp"))
}

/// `5s`, `3m20s`, `4h`: kubectl's short ages.
pub fn age(t: Option<jiff::Timestamp>) -> String {
    match t {
        Some(t) => shepherd_api::human_age(jiff::Timestamp::now().as_second() - t.as_second()),
        None => "<unknown>".into(),
    }
}

fn map_lines(map: Option<&Value>, pad: usize, skip: &[&str]) -> String {
    let entries: Vec<String> = map.and_then(Value::as_object).into_iter().flatten()
        .filter(|(k, _)| !skip.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={}", v.as_str().map(String::from).unwrap_or_else(|| v.to_string())))
        .collect();
    if entries.is_empty() { "<none>".into() } else { entries.join(&format!("\n{}", " ".repeat(pad))) }
}

fn field(out: &mut String, width: usize, name: &str, value: &str) {
    let label = format!("{name}:");
    let _ = writeln!(out, "{label:<width$}{value}");
}

fn common_header(out: &mut String, obj: &Value, w: usize, namespaced: bool) {
    field(out, w, "Name", str_at(obj, "/metadata/name"));
    if namespaced {
        field(out, w, "Namespace", str_at(obj, "/metadata/namespace"));
    }
}

fn meta_maps(out: &mut String, obj: &Value, w: usize) {
    field(out, w, "Labels", &map_lines(obj.pointer("/metadata/labels"), w, &[]));
    field(out, w, "Annotations", &map_lines(obj.pointer("/metadata/annotations"), w, &[LAST_APPLIED]));
}

fn conditions(out: &mut String, obj: &Value, with_reason: bool) {
    let Some(conds) = obj.pointer("/status/conditions").and_then(Value::as_array).filter(|c| !c.is_empty()) else { return };
    let mut t = printer::TextTable { header: vec!["Type".into(), "Status".into()], rows: Vec::new() };
    if with_reason {
        t.header.push("Reason".into());
    }
    for c in conds {
        let mut row = vec![str_at(c, "/type").to_string(), str_at(c, "/status").to_string()];
        if with_reason {
            row.push(str_at(c, "/reason").to_string());
        }
        t.rows.push(row);
    }
    let dashes: Vec<String> = t.header.iter().map(|h| "-".repeat(h.len())).collect();
    t.rows.insert(0, dashes);
    out.push_str("Conditions:\n");
    for line in printer::render(&t).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

fn events_section(out: &mut String, events: &[Value]) {
    if events.is_empty() {
        out.push_str("Events:  <none>\n");
        return;
    }
    let mut t = printer::TextTable {
        header: ["Type", "Reason", "Age", "From", "Message"].map(String::from).to_vec(),
        rows: vec![["----", "------", "----", "----", "-------"].map(String::from).to_vec()],
    };
    for e in events {
        let count = e.get("count").and_then(Value::as_i64).unwrap_or(1);
        let mut seen = age(last_seen(e));
        if count > 1 {
            seen = format!("{seen} (x{count} over {})", age(timestamp(e, "/firstTimestamp")));
        }
        let from = [str_at(e, "/source/component"), str_at(e, "/reportingComponent")].into_iter().find(|c| !c.is_empty()).unwrap_or("").to_string();
        t.rows.push(vec![str_at(e, "/type").into(), str_at(e, "/reason").into(), seen, from, str_at(e, "/message").into()]);
    }
    out.push_str("Events:\n");
    for line in printer::render(&t).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// The full text of `describe` for one object.
pub fn describe(res: &ResourceInfo, obj: &Value, events: &[Value]) -> String {
    let mut out = String::new();
    match res.kind {
        "Pod" => pod(&mut out, obj),
        "Deployment" => deployment(&mut out, obj),
        "Secret" => secret(&mut out, obj),
        "ConfigMap" => config_map(&mut out, obj),
        "Job" => job(&mut out, obj),
        "CronJob" => cron_job(&mut out, obj),
        "DaemonSet" => daemon_set(&mut out, obj),
        "StatefulSet" => stateful_set(&mut out, obj),
        "HorizontalPodAutoscaler" => autoscaler(&mut out, obj),
        _ => generic(&mut out, res, obj),
    }
    events_section(&mut out, events);
    out
}

fn controlled_by(obj: &Value) -> Option<String> {
    obj.pointer("/metadata/ownerReferences").and_then(Value::as_array)?.iter()
        .find(|o| o["controller"] == true)
        .map(|o| format!("{}/{}", str_at(o, "/kind"), str_at(o, "/name")))
}

fn pod(out: &mut String, p: &Value) {
    let w = 18;
    common_header(out, p, w, true);
    field(out, w, "Node", &match (str_at(p, "/spec/nodeName"), str_at(p, "/status/hostIP")) {
        ("", _) => "<none>".to_string(),
        (n, "") => n.to_string(),
        (n, ip) => format!("{n}/{ip}"),
    });
    if let Some(start) = p.pointer("/status/startTime").and_then(Value::as_str) {
        field(out, w, "Start Time", start);
    }
    meta_maps(out, p, w);
    let status = if p.pointer("/metadata/deletionTimestamp").is_some() { "Terminating".to_string() } else { or_none(str_at(p, "/status/phase")) };
    field(out, w, "Status", &status);
    field(out, w, "IP", str_at(p, "/status/podIP"));
    if let Some(c) = controlled_by(p) {
        field(out, w, "Controlled By", &c);
    }
    out.push_str("Containers:\n");
    let statuses = p.pointer("/status/containerStatuses").and_then(Value::as_array).cloned().unwrap_or_default();
    for c in p.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
        let cname = str_at(c, "/name");
        let _ = writeln!(out, "  {cname}:");
        let cw = 20;
        let sub = |out: &mut String, k: &str, v: &str| {
            let label = format!("{k}:");
            let _ = writeln!(out, "    {label:<cw$}{v}");
        };
        sub(out, "Image", str_at(c, "/image"));
        if let Some(cmd) = c.get("command").and_then(Value::as_array) {
            sub(out, "Command", &cmd.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "));
        }
        if let Some(args) = c.get("args").and_then(Value::as_array) {
            sub(out, "Args", &args.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(" "));
        }
        let ports: Vec<String> = c.get("ports").and_then(Value::as_array).into_iter().flatten()
            .map(|p| format!("{}/{}", p["containerPort"], p.get("protocol").and_then(Value::as_str).unwrap_or("TCP"))).collect();
        sub(out, "Port", &if ports.is_empty() { "<none>".into() } else { ports.join(", ") });
        let cs = statuses.iter().find(|st| st["name"] == cname);
        let state = cs.and_then(|st| st.get("state")).and_then(Value::as_object).and_then(|m| m.iter().next());
        match state {
            Some((k, detail)) => {
                let mut word = k.clone();
                if let Some(first) = word.get_mut(0..1) {
                    first.make_ascii_uppercase();
                }
                sub(out, "State", &word);
                if let Some(reason) = detail.get("reason").and_then(Value::as_str) {
                    sub(out, "  Reason", reason);
                }
                if let Some(started) = detail.get("startedAt").and_then(Value::as_str) {
                    sub(out, "  Started", started);
                }
            }
            None => sub(out, "State", "Waiting"),
        }
        sub(out, "Ready", if cs.is_some_and(|st| st["ready"] == true) { "True" } else { "False" });
        sub(out, "Restart Count", &cs.and_then(|st| st["restartCount"].as_i64()).unwrap_or(0).to_string());
        let env: Vec<String> = c.get("env").and_then(Value::as_array).into_iter().flatten()
            .map(|e| format!("{}={}", str_at(e, "/name"), str_at(e, "/value"))).collect();
        if !env.is_empty() {
            sub(out, "Environment", &env.join(&format!("\n{}", " ".repeat(4 + cw))));
        }
    }
    conditions(out, p, false);
    field(out, w, "Node-Selectors", &map_lines(p.pointer("/spec/nodeSelector"), w, &[]));
}

fn or_none(v: &str) -> String {
    if v.is_empty() { "<none>".into() } else { v.into() }
}

fn deployment(out: &mut String, d: &Value) {
    let w = 24;
    common_header(out, d, w, true);
    field(out, w, "CreationTimestamp", str_at(d, "/metadata/creationTimestamp"));
    meta_maps(out, d, w);
    field(out, w, "Selector", &selector(d));
    let n = |p: &str| d.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    field(out, w, "Replicas", &format!("{} desired | {} updated | {} total | {} available | {} unavailable",
        d.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1), n("/status/updatedReplicas"), n("/status/replicas"),
        n("/status/availableReplicas"), n("/status/unavailableReplicas")));
    let strategy = or_none(str_at(d, "/spec/strategy/type"));
    field(out, w, "StrategyType", &strategy);
    field(out, w, "MinReadySeconds", &n("/spec/minReadySeconds").to_string());
    if strategy == "RollingUpdate" {
        let v = |p: &str| d.pointer(p).map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string())).unwrap_or_else(|| "25%".into());
        field(out, w, "RollingUpdateStrategy", &format!("{} max unavailable, {} max surge",
            v("/spec/strategy/rollingUpdate/maxUnavailable"), v("/spec/strategy/rollingUpdate/maxSurge")));
    }
    out.push_str("Pod Template:\n");
    let _ = writeln!(out, "  Labels:  {}", map_lines(d.pointer("/spec/template/metadata/labels"), 11, &[]));
    if d.pointer("/spec/template/metadata/annotations").is_some() {
        let _ = writeln!(out, "  Annotations:  {}", map_lines(d.pointer("/spec/template/metadata/annotations"), 16, &[]));
    }
    out.push_str("  Containers:\n");
    for c in d.pointer("/spec/template/spec/containers").and_then(Value::as_array).into_iter().flatten() {
        let _ = writeln!(out, "   {}:", str_at(c, "/name"));
        let _ = writeln!(out, "    Image:      {}", str_at(c, "/image"));
        let ports: Vec<String> = c.get("ports").and_then(Value::as_array).into_iter().flatten()
            .map(|p| format!("{}/{}", p["containerPort"], p.get("protocol").and_then(Value::as_str).unwrap_or("TCP"))).collect();
        let _ = writeln!(out, "    Port:       {}", if ports.is_empty() { "<none>".into() } else { ports.join(", ") });
    }
    conditions(out, d, true);
}

/// A pod template's labels and containers, as kubectl prints them under `Pod Template:`.
fn pod_template(out: &mut String, template: Option<&Value>) {
    let t = template.cloned().unwrap_or(Value::Null);
    out.push_str("Pod Template:\n");
    let _ = writeln!(out, "  Labels:  {}", map_lines(t.pointer("/metadata/labels"), 11, &[]));
    out.push_str("  Containers:\n");
    for c in t.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
        let _ = writeln!(out, "   {}:", str_at(c, "/name"));
        let _ = writeln!(out, "    Image:      {}", str_at(c, "/image"));
        for (label, key) in [("Command", "/command"), ("Args", "/args")] {
            let Some(words) = c.pointer(key).and_then(Value::as_array).filter(|w| !w.is_empty()) else { continue };
            let _ = writeln!(out, "    {label}:");
            for word in words {
                let _ = writeln!(out, "      {}", word.as_str().unwrap_or(""));
            }
        }
    }
}

fn job(out: &mut String, j: &Value) {
    let w = 20;
    common_header(out, j, w, true);
    field(out, w, "Selector", &selector(j));
    meta_maps(out, j, w);
    if let Some(owner) = controlled_by(j) {
        field(out, w, "Controlled By", &owner);
    }
    let n = |p: &str| j.pointer(p).and_then(Value::as_i64);
    let unset = |v: Option<i64>| v.map_or_else(|| "<unset>".to_string(), |v| v.to_string());
    field(out, w, "Parallelism", &unset(n("/spec/parallelism")));
    field(out, w, "Completions", &unset(n("/spec/completions")));
    field(out, w, "Completion Mode", &or_none(str_at(j, "/spec/completionMode")));
    field(out, w, "Suspend", &j.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false).to_string());
    field(out, w, "Backoff Limit", &unset(n("/spec/backoffLimit")));
    if let Some(ttl) = n("/spec/ttlSecondsAfterFinished") {
        field(out, w, "TTL After Finished", &format!("{ttl}s"));
    }
    if let Some(deadline) = n("/spec/activeDeadlineSeconds") {
        field(out, w, "Active Deadline Seconds", &format!("{deadline}s"));
    }
    let start = timestamp(j, "/status/startTime");
    if let Some(t) = start {
        field(out, w, "Start Time", &t.strftime("%a, %d %b %Y %H:%M:%S %z").to_string());
    }
    let end = timestamp(j, "/status/completionTime");
    if let Some(t) = end {
        field(out, w, "Completed At", &t.strftime("%a, %d %b %Y %H:%M:%S %z").to_string());
    }
    if let (Some(a), Some(b)) = (start, end) {
        field(out, w, "Duration", &shepherd_api::human_age(b.as_second() - a.as_second()));
    }
    let c = |p: &str| n(p).unwrap_or(0);
    field(out, w, "Pods Statuses", &format!("{} Active ({} Ready) / {} Succeeded / {} Failed",
        c("/status/active"), c("/status/ready"), c("/status/succeeded"), c("/status/failed")));
    if str_at(j, "/spec/completionMode") == "Indexed" {
        field(out, w, "Completed Indexes", &or_none(str_at(j, "/status/completedIndexes")));
    }
    pod_template(out, j.pointer("/spec/template"));
    conditions(out, j, true);
}

fn cron_job(out: &mut String, cj: &Value) {
    let w = 31;
    common_header(out, cj, w, true);
    meta_maps(out, cj, w);
    let n = |p: &str| cj.pointer(p).and_then(Value::as_i64).map_or_else(|| "<unset>".to_string(), |v| v.to_string());
    field(out, w, "Schedule", str_at(cj, "/spec/schedule"));
    if cj.pointer("/spec/timeZone").is_some() {
        field(out, w, "Time Zone", str_at(cj, "/spec/timeZone"));
    }
    field(out, w, "Concurrency Policy", &or_none(str_at(cj, "/spec/concurrencyPolicy")));
    let suspended = cj.pointer("/spec/suspend").and_then(Value::as_bool).unwrap_or(false);
    field(out, w, "Suspend", if suspended { "True" } else { "False" });
    field(out, w, "Successful Job History Limit", &n("/spec/successfulJobsHistoryLimit"));
    field(out, w, "Failed Job History Limit", &n("/spec/failedJobsHistoryLimit"));
    field(out, w, "Starting Deadline Seconds", &n("/spec/startingDeadlineSeconds"));
    field(out, w, "Parallelism", &n("/spec/jobTemplate/spec/parallelism"));
    field(out, w, "Completions", &n("/spec/jobTemplate/spec/completions"));
    pod_template(out, cj.pointer("/spec/jobTemplate/spec/template"));
    let last = timestamp(cj, "/status/lastScheduleTime").map(|t| t.strftime("%a, %d %b %Y %H:%M:%S %z").to_string());
    field(out, 21, "Last Schedule Time", last.as_deref().unwrap_or("<unset>"));
    let active: Vec<&str> = cj.pointer("/status/active").and_then(Value::as_array).into_iter().flatten()
        .filter_map(|r| r.get("name").and_then(Value::as_str)).collect();
    field(out, 21, "Active Jobs", &if active.is_empty() { "<none>".to_string() } else { active.join(", ") });
}

/// As kubectl describes one: each metric as `current / target`, the bounds, the target's pods and
/// the conditions with their messages.
fn autoscaler(out: &mut String, hpa: &Value) {
    let w = 55;
    common_header(out, hpa, w, true);
    meta_maps(out, hpa, w);
    field(out, w, "Reference", &format!("{}/{}", str_at(hpa, "/spec/scaleTargetRef/kind"), str_at(hpa, "/spec/scaleTargetRef/name")));
    field(out, w, "Metrics", "( current / target )");
    let current = hpa.pointer("/status/currentMetrics").and_then(Value::as_array).cloned().unwrap_or_default();
    for m in hpa.pointer("/spec/metrics").and_then(Value::as_array).into_iter().flatten() {
        let name = str_at(m, "/resource/name");
        let now = current.iter().find(|c| str_at(c, "/resource/name") == name);
        if str_at(m, "/resource/target/type") == "Utilization" {
            let pct = now.and_then(|c| c.pointer("/resource/current/averageUtilization")).and_then(Value::as_i64);
            let value = now.map(|c| str_at(c, "/resource/current/averageValue")).unwrap_or("");
            let shown = pct.map_or("<unknown>".to_string(), |p| format!("{p}% ({value})"));
            let target = hpa_int(m, "/resource/target/averageUtilization");
            field(out, w, &format!("  resource {name} on pods  (as a percentage of request)"), &format!("{shown} / {target}%"));
        } else {
            let value = now.map(|c| str_at(c, "/resource/current/averageValue")).filter(|v| !v.is_empty()).unwrap_or("<unknown>");
            field(out, w, &format!("  resource {name} on pods"), &format!("{value} / {}", str_at(m, "/resource/target/averageValue")));
        }
    }
    field(out, w, "Min replicas", &hpa_int(hpa, "/spec/minReplicas"));
    field(out, w, "Max replicas", &hpa_int(hpa, "/spec/maxReplicas"));
    let pods = format!("{} current / {} desired", hpa_int(hpa, "/status/currentReplicas"), hpa_int(hpa, "/status/desiredReplicas"));
    field(out, w, &format!("{} pods", str_at(hpa, "/spec/scaleTargetRef/kind")), &pods);
    let Some(conds) = hpa.pointer("/status/conditions").and_then(Value::as_array).filter(|c| !c.is_empty()) else { return };
    let mut t = printer::TextTable { header: ["Type", "Status", "Reason", "Message"].map(String::from).to_vec(), rows: Vec::new() };
    t.rows.push(t.header.iter().map(|h| "-".repeat(h.len())).collect());
    for c in conds {
        t.rows.push(["/type", "/status", "/reason", "/message"].iter().map(|p| str_at(c, p).to_string()).collect());
    }
    out.push_str("Conditions:\n");
    for line in printer::render(&t).lines() {
        let _ = writeln!(out, "  {line}");
    }
}

fn hpa_int(v: &Value, ptr: &str) -> String {
    v.pointer(ptr).and_then(Value::as_i64).map_or_else(|| "<unset>".to_string(), |n| n.to_string())
}

fn daemon_set(out: &mut String, ds: &Value) {
    let w = 16;
    field(out, w, "Name", str_at(ds, "/metadata/name"));
    field(out, w, "Namespace", str_at(ds, "/metadata/namespace"));
    field(out, w, "Selector", &selector(ds));
    field(out, w, "Node-Selector", &map_lines(ds.pointer("/spec/template/spec/nodeSelector"), w, &[]));
    meta_maps(out, ds, w);
    let n = |p: &str| ds.pointer(p).and_then(Value::as_i64).unwrap_or(0).to_string();
    let w = 48;
    field(out, w, "Desired Number of Nodes Scheduled", &n("/status/desiredNumberScheduled"));
    field(out, w, "Current Number of Nodes Scheduled", &n("/status/currentNumberScheduled"));
    field(out, w, "Number of Nodes Scheduled with Up-to-date Pods", &n("/status/updatedNumberScheduled"));
    field(out, w, "Number of Nodes Scheduled with Available Pods", &n("/status/numberAvailable"));
    field(out, w, "Number of Nodes Misscheduled", &n("/status/numberMisscheduled"));
    let strategy = or_none(str_at(ds, "/spec/updateStrategy/type"));
    field(out, 18, "Update Strategy", &strategy);
    if strategy == "RollingUpdate" {
        let v = |p: &str| ds.pointer(p).map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string())).unwrap_or_else(|| "0".into());
        let _ = writeln!(out, "  Max Unavailable:  {}", v("/spec/updateStrategy/rollingUpdate/maxUnavailable"));
        let _ = writeln!(out, "  Max Surge:        {}", v("/spec/updateStrategy/rollingUpdate/maxSurge"));
    }
    pod_template(out, ds.pointer("/spec/template"));
}

fn stateful_set(out: &mut String, sts: &Value) {
    let w = 23;
    common_header(out, sts, w, true);
    field(out, w, "CreationTimestamp", str_at(sts, "/metadata/creationTimestamp"));
    field(out, w, "Selector", &selector(sts));
    meta_maps(out, sts, w);
    let n = |p: &str| sts.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    field(out, w, "Replicas", &format!("{} desired | {} total", sts.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1),
        n("/status/replicas")));
    field(out, w, "Pod Management Policy", &or_none(str_at(sts, "/spec/podManagementPolicy")));
    let strategy = or_none(str_at(sts, "/spec/updateStrategy/type"));
    field(out, w, "Update Strategy", &strategy);
    if strategy == "RollingUpdate" {
        let _ = writeln!(out, "  Partition:           {}", n("/spec/updateStrategy/rollingUpdate/partition"));
    }
    field(out, w, "Service Name", &or_none(str_at(sts, "/spec/serviceName")));
    field(out, w, "Current Revision", &or_none(str_at(sts, "/status/currentRevision")));
    field(out, w, "Update Revision", &or_none(str_at(sts, "/status/updateRevision")));
    field(out, w, "Ready Replicas", &n("/status/readyReplicas").to_string());
    pod_template(out, sts.pointer("/spec/template"));
    out.push_str("Volume Claims:  <none>\n");
}

fn selector(d: &Value) -> String {
    let mut parts: Vec<String> = d.pointer("/spec/selector/matchLabels").and_then(Value::as_object).into_iter().flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect();
    for e in d.pointer("/spec/selector/matchExpressions").and_then(Value::as_array).into_iter().flatten() {
        let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        parts.push(format!("{} {} ({})", str_at(e, "/key"), str_at(e, "/operator").to_lowercase(), values.join(",")));
    }
    if parts.is_empty() { "<none>".into() } else { parts.join(",") }
}

/// Kinds without a dedicated layout: metadata, then spec and status as indented fields.
/// The size of a base64 value as the bytes it stands for.
fn decoded_size(v: &Value) -> usize {
    use base64::Engine;
    let raw = v.as_str().unwrap_or_default();
    base64::engine::general_purpose::STANDARD.decode(raw).map_or(raw.len(), |b| b.len())
}

/// A Secret's keys and the sizes of their values; never the values.
fn secret(out: &mut String, obj: &Value) {
    let w = 14;
    common_header(out, obj, w, true);
    meta_maps(out, obj, w);
    let _ = writeln!(out, "\nType:  {}\n\nData\n====", str_at(obj, "/type"));
    let data = obj.get("data").and_then(Value::as_object);
    let width = data.into_iter().flatten().map(|(k, _)| k.len() + 3).max().unwrap_or(0);
    for (k, v) in data.into_iter().flatten() {
        let label = format!("{k}:");
        let _ = writeln!(out, "{label:<width$}{} bytes", decoded_size(v));
    }
}

/// A ConfigMap's data in full, and the sizes of its binary data.
fn config_map(out: &mut String, obj: &Value) {
    let w = 14;
    common_header(out, obj, w, true);
    meta_maps(out, obj, w);
    out.push_str("\nData\n====\n");
    for (k, v) in obj.get("data").and_then(Value::as_object).into_iter().flatten() {
        let _ = writeln!(out, "{k}:\n----\n{}\n", v.as_str().unwrap_or_default());
    }
    out.push_str("\nBinaryData\n====\n");
    for (k, v) in obj.get("binaryData").and_then(Value::as_object).into_iter().flatten() {
        let _ = writeln!(out, "{k}: {} bytes", decoded_size(v));
    }
}

fn generic(out: &mut String, res: &ResourceInfo, obj: &Value) {
    let w = 18;
    common_header(out, obj, w, res.namespaced);
    meta_maps(out, obj, w);
    field(out, w, "CreationTimestamp", str_at(obj, "/metadata/creationTimestamp"));
    for (key, v) in obj.as_object().into_iter().flatten() {
        if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") || holds_nothing(v) {
            continue;
        }
        let mut title = key.clone();
        if let Some(f) = title.get_mut(0..1) {
            f.make_ascii_uppercase();
        }
        nested(out, &title, v, 0);
    }
}

/// An object whose every leaf is an empty object, such as a Service's `status: {loadBalancer: {}}`:
/// nothing a reader wants a section for.
fn holds_nothing(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.values().all(|x| x.is_object() && holds_nothing(x)),
        _ => false,
    }
}

fn nested(out: &mut String, key: &str, v: &Value, depth: usize) {
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) if m.is_empty() => {
            let _ = writeln!(out, "{pad}{key}:  <none>");
        }
        Value::Object(m) => {
            let _ = writeln!(out, "{pad}{key}:");
            for (k, x) in m {
                nested(out, k, x, depth + 1);
            }
        }
        Value::Array(a) if a.is_empty() => {
            let _ = writeln!(out, "{pad}{key}:  <none>");
        }
        Value::Array(a) => {
            let _ = writeln!(out, "{pad}{key}:");
            for x in a {
                match x {
                    Value::Object(m) => {
                        for (i, (k, y)) in m.iter().enumerate() {
                            let k = if i == 0 { format!("- {k}") } else { format!("  {k}") };
                            nested(out, &k, y, depth + 1);
                        }
                    }
                    other => nested(out, "-", other, depth + 1),
                }
            }
        }
        Value::String(s) => {
            let _ = writeln!(out, "{pad}{key}:  {s}");
        }
        other => {
            let _ = writeln!(out, "{pad}{key}:  {other}");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_autoscaler_is_described_with_current_and_target_metrics_and_its_conditions() {
        let hpa = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 1, "maxReplicas": 5,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]},
            "status": {"currentReplicas": 2, "desiredReplicas": 4,
                "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 95, "averageValue": "190m"}}}],
                "conditions": [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound", "message": "ok"}]}});
        let text = describe(&shepherd_api::kinds::HORIZONTALPODAUTOSCALER, &hpa, &[]);
        assert!(text.contains("Reference:") && text.contains("Deployment/web"), "{text}");
        assert!(text.contains("resource cpu on pods  (as a percentage of request):  95% (190m) / 50%"), "{text}");
        assert!(text.contains("Deployment pods:") && text.contains("2 current / 4 desired"), "{text}");
        assert!(text.contains("ScalingActive") && text.contains("ValidMetricFound"), "{text}");
    }
}
