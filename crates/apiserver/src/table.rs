//! Server-side printing: the `Table` form kubectl asks for (`Accept: ...;as=Table`), with the
//! columns a Kubernetes user expects for each kind.

use serde_json::{Value, json};
use shepherd_api::{JsonPath, int_at, str_at};
use shepherd_api::kinds::ResourceInfo;

pub use shepherd_api::human_age;

fn age(obj: &Value, field: &str) -> String {
    let ts = obj.at(field).and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match ts {
        Some(t) => human_age(jiff::Timestamp::now().as_second() - t.as_second()),
        None => "<unknown>".into(),
    }
}

fn or_none(v: &str) -> String {
    if v.is_empty() { "<none>".into() } else { v.into() }
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.at("/status/conditions")?.as_array()?.iter().find(|c| c["type"] == type_)
}

/// The STATUS column of a pod, as Kubernetes' pod printer derives it: the phase (or the pod's
/// reason), overridden by its containers', last container first: a waiting reason, a terminated
/// reason (`Completed`, `Error`, `OOMKilled`; `ExitCode:N` or `Signal:N` without one); `Completed`
/// turns back into `Running` (or `NotReady`) while another container still runs; `Terminating`
/// once deletion started, unless the pod has already finished (`Unknown` when its node was lost).
pub fn pod_status(pod: &Value) -> String {
    let phase = str_at(pod, "/status/phase");
    let mut status = match str_at(pod, "/status/reason") {
        "" => phase.to_string(),
        reason => reason.to_string(),
    };
    let mut running = false;
    let statuses = pod.at("/status/containerStatuses").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    for cs in statuses.iter().rev() {
        let (waiting, terminated) = (cs.at("/state/waiting"), cs.at("/state/terminated"));
        if let Some(reason) = waiting.map(|w| str_at(w, "/reason")).filter(|r| !r.is_empty()) {
            status = reason.to_string();
        } else if let Some(t) = terminated {
            status = match (str_at(t, "/reason"), int_at(t, "/signal")) {
                ("", signal) if signal != 0 => format!("Signal:{signal}"),
                ("", _) => format!("ExitCode:{}", int_at(t, "/exitCode")),
                (reason, _) => reason.to_string(),
            };
        } else if cs["ready"] == true && cs.at("/state/running").is_some() {
            running = true;
        }
    }
    if status == "Completed" && running {
        status = if condition(pod, "Ready").is_some() { "Running" } else { "NotReady" }.to_string();
    }
    if pod.at("/metadata/deletionTimestamp").is_some() {
        // The node lifecycle controller's reason for pods of a node that stopped answering.
        if str_at(pod, "/status/reason") == "NodeLost" {
            return "Unknown".into();
        }
        if !matches!(phase, "Succeeded" | "Failed") {
            return "Terminating".into();
        }
    }
    if status.is_empty() { "Unknown".into() } else { status }
}

fn pod_ready(pod: &Value) -> String {
    let total = pod.at("/spec/containers").and_then(Value::as_array).map_or(0, Vec::len);
    let ready = pod
        .at("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(0, |cs| cs.iter().filter(|c| c["ready"] == true).count());
    format!("{ready}/{total}")
}

fn pod_restarts(pod: &Value) -> i64 {
    pod.at("/status/containerStatuses")
        .and_then(Value::as_array)
        .map_or(0, |cs| cs.iter().map(|c| c["restartCount"].as_i64().unwrap_or(0)).sum())
}

fn node_status(node: &Value) -> String {
    let mut st = match condition(node, "Ready").map(|c| str_at(c, "/status")) {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if node.at("/spec/unschedulable") == Some(&json!(true)) {
        st.push_str(",SchedulingDisabled");
    }
    st
}

fn node_roles(node: &Value) -> String {
    let roles: Vec<&str> = node
        .at("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| l.keys().filter_map(|k| k.strip_prefix("node-role.kubernetes.io/")).collect())
        .unwrap_or_default();
    if roles.is_empty() { "<none>".into() } else { roles.join(",") }
}

fn service_ports(svc: &Value) -> String {
    let ports: Vec<String> = svc
        .at("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            match p.get("nodePort").and_then(Value::as_i64).filter(|n| *n != 0) {
                Some(node_port) => format!("{}:{node_port}/{protocol}", int_at(p, "/port")),
                None => format!("{}/{protocol}", int_at(p, "/port")),
            }
        })
        .collect();
    if ports.is_empty() { "<none>".into() } else { ports.join(",") }
}

/// A LoadBalancer Service's ingress addresses, `<pending>` until it has one, as kubectl shows them.
fn external_ip(svc: &Value) -> String {
    let ingress: Vec<&str> = svc
        .at("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("ip").or_else(|| i.get("hostname")).and_then(Value::as_str))
        .collect();
    match (str_at(svc, "/spec/type"), ingress.is_empty()) {
        ("LoadBalancer", true) => "<pending>".into(),
        (_, false) => ingress.join(","),
        _ => "<none>".into(),
    }
}

fn endpoints(ep: &Value) -> String {
    let mut out = Vec::new();
    for subset in ep.get("subsets").and_then(Value::as_array).into_iter().flatten() {
        let ports: Vec<i64> =
            subset.get("ports").and_then(Value::as_array).into_iter().flatten().map(|p| int_at(p, "/port")).collect();
        for a in subset.get("addresses").and_then(Value::as_array).into_iter().flatten() {
            let ip = str_at(a, "/ip");
            if ports.is_empty() {
                out.push(ip.to_string());
            }
            for p in &ports {
                out.push(format!("{ip}:{p}"));
            }
        }
    }
    if out.is_empty() {
        return "<none>".into();
    }
    let more = out.len().saturating_sub(3);
    out.truncate(3);
    let mut s = out.join(",");
    if more > 0 {
        s.push_str(&format!(" + {more} more..."));
    }
    s
}

/// kubectl's `+ N more...` list: the first three items, then how many were left out.
fn at_most_three(mut items: Vec<String>, empty: &str) -> String {
    if items.is_empty() {
        return empty.into();
    }
    let more = items.len().saturating_sub(3);
    items.truncate(3);
    let mut s = items.join(",");
    if more > 0 {
        s.push_str(&format!(" + {more} more..."));
    }
    s
}

fn slice_ports(slice: &Value) -> String {
    let ports = slice.get("ports").and_then(Value::as_array).into_iter().flatten().filter_map(|p| p.get("port")?.as_i64());
    at_most_three(ports.map(|p| p.to_string()).collect(), "<unset>")
}

fn slice_endpoints(slice: &Value) -> String {
    let addresses = slice.get("endpoints").and_then(Value::as_array).into_iter().flatten().flat_map(|e| {
        e.get("addresses").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string)
    });
    at_most_three(addresses.collect(), "<unset>")
}

/// A PDB's `minAvailable` or `maxUnavailable`, `N/A` when unset.
fn int_or_percent(obj: &Value, ptr: &str) -> String {
    match obj.at(ptr) {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => "N/A".into(),
    }
}

fn containers(obj: &Value, ptr: &str, field: &str) -> String {
    obj.at(ptr)
        .and_then(Value::as_array)
        .map(|cs| cs.iter().map(|c| str_at(c, field)).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

/// The STATUS column of a Job: its terminal or pending-terminal condition, else Suspended,
/// Terminating or Running.
fn job_status(job: &Value) -> &'static str {
    let is_true = |t: &str| condition(job, t).is_some_and(|c| c["status"] == "True");
    for t in ["Failed", "Complete", "FailureTarget", "SuccessCriteriaMet", "Suspended"] {
        if is_true(t) {
            return t;
        }
    }
    if job.at("/metadata/deletionTimestamp").is_some() { "Terminating" } else { "Running" }
}

/// `3/5`, or `0/1 of 4` for a work queue Job (parallelism only).
fn job_completions(job: &Value) -> String {
    let succeeded = int_at(job, "/status/succeeded");
    match job.at("/spec/completions").and_then(Value::as_i64) {
        Some(c) => format!("{succeeded}/{c}"),
        None => match int_at(job, "/spec/parallelism") {
            p if p > 1 => format!("{succeeded}/1 of {p}"),
            _ => format!("{succeeded}/1"),
        },
    }
}

/// From start to completion, or to now while the Job runs.
fn job_duration(job: &Value) -> String {
    let time = |p: &str| job.at(p).and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
    let Some(start) = time("/status/startTime") else { return String::new() };
    let end = time("/status/completionTime").unwrap_or_else(jiff::Timestamp::now);
    human_age(end.as_second() - start.as_second())
}

/// Entries of the map at `ptr` (a ConfigMap's or Secret's data).
/// `10m` for `spec.expirationSeconds: 600`, `<none>` without one, as kubectl prints it.
fn csr_requested_duration(csr: &Value) -> String {
    match csr.at("/spec/expirationSeconds").and_then(Value::as_i64) {
        Some(secs) => human_age(secs),
        None => "<none>".into(),
    }
}

/// `Approved,Issued`, `Denied`, `Pending`: the CSR's decision and whether it has a certificate.
fn csr_condition(csr: &Value) -> String {
    let mut parts: Vec<&str> = csr
        .at("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|c| str_at(c, "/status") == "True")
        .map(|c| str_at(c, "/type"))
        .filter(|t| !t.is_empty())
        .collect();
    if parts.is_empty() {
        parts.push("Pending");
    }
    if csr.at("/status/certificate").and_then(Value::as_str).is_some_and(|c| !c.is_empty()) {
        parts.push("Issued");
    }
    parts.join(",")
}

fn entries(obj: &Value, ptr: &str) -> usize {
    obj.at(ptr).and_then(Value::as_object).map_or(0, serde_json::Map::len)
}

fn selector_string(obj: &Value) -> String {
    let labels = obj.at("/spec/selector/matchLabels").and_then(Value::as_object);
    labels
        .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(","))
        .unwrap_or_default()
}

type Column = (&'static str, &'static str, u8);

/// Column names, types and priorities (priority 1 shows only with `-o wide`), then the cells.
fn columns(res: &ResourceInfo) -> Vec<Column> {
    let name = ("Name", "string", 0);
    let age = ("Age", "string", 0);
    match res.kind {
        "Pod" => vec![name, ("Ready", "string", 0), ("Status", "string", 0), ("Restarts", "integer", 0), age,
            ("IP", "string", 1), ("Node", "string", 1)],
        "Deployment" => vec![name, ("Ready", "string", 0), ("Up-to-date", "integer", 0), ("Available", "integer", 0), age,
            ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)],
        "ReplicaSet" | "ReplicationController" => vec![name, ("Desired", "integer", 0), ("Current", "integer", 0), ("Ready", "integer", 0), age,
            ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)],
        "Node" => vec![name, ("Status", "string", 0), ("Roles", "string", 0), age, ("Version", "string", 0),
            ("Internal-IP", "string", 1), ("OS-Image", "string", 1)],
        "Service" => vec![name, ("Type", "string", 0), ("Cluster-IP", "string", 0), ("External-IP", "string", 0),
            ("Port(s)", "string", 0), age, ("Selector", "string", 1)],
        "Endpoints" => vec![name, ("Endpoints", "string", 0), age],
        "Namespace" => vec![name, ("Status", "string", 0), age],
        "Event" => vec![("Last Seen", "string", 0), ("Type", "string", 0), ("Reason", "string", 0),
            ("Object", "string", 0), ("Message", "string", 0)],
        "Lease" => vec![name, ("Holder", "string", 0), age],
        "CertificateSigningRequest" => vec![name, age, ("SignerName", "string", 0), ("Requestor", "string", 0),
            ("RequestedDuration", "string", 0), ("Condition", "string", 0)],
        "EndpointSlice" => vec![name, ("AddressType", "string", 0), ("Ports", "string", 0), ("Endpoints", "string", 0), age],
        "PodDisruptionBudget" => vec![name, ("Min Available", "string", 0), ("Max Unavailable", "string", 0),
            ("Allowed Disruptions", "integer", 0), age],
        "ConfigMap" => vec![name, ("Data", "integer", 0), age],
        "Secret" => vec![name, ("Type", "string", 0), ("Data", "integer", 0), age],
        "ServiceAccount" => vec![name, ("Secrets", "integer", 0), age],
        "CustomResourceDefinition" => vec![name, ("Created At", "date", 0)],
        "Job" => vec![name, ("Status", "string", 0), ("Completions", "string", 0), ("Duration", "string", 0), age,
            ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)],
        "CronJob" => vec![name, ("Schedule", "string", 0), ("Timezone", "string", 0), ("Suspend", "boolean", 0),
            ("Active", "integer", 0), ("Last Schedule", "string", 0), age, ("Containers", "string", 1),
            ("Images", "string", 1), ("Selector", "string", 1)],
        "DaemonSet" => vec![name, ("Desired", "integer", 0), ("Current", "integer", 0), ("Ready", "integer", 0),
            ("Up-to-date", "integer", 0), ("Available", "integer", 0), ("Node Selector", "string", 0), age,
            ("Containers", "string", 1), ("Images", "string", 1), ("Selector", "string", 1)],
        "StatefulSet" => vec![name, ("Ready", "string", 0), age, ("Containers", "string", 1), ("Images", "string", 1)],
        "ControllerRevision" => vec![name, ("Controller", "string", 0), ("Revision", "integer", 0), age],
        "Role" | "ClusterRole" => vec![name, ("Created At", "date", 0)],
        "RoleBinding" | "ClusterRoleBinding" => vec![name, ("Role", "string", 0), age, ("Users", "string", 1),
            ("Groups", "string", 1), ("ServiceAccounts", "string", 1)],
        "HorizontalPodAutoscaler" => vec![name, ("Reference", "string", 0), ("Targets", "string", 0),
            ("MinPods", "string", 0), ("MaxPods", "integer", 0), ("Replicas", "integer", 0), age],
        _ => vec![name, age],
    }
}

fn cells(res: &ResourceInfo, o: &Value) -> Vec<Value> {
    let name = json!(str_at(o, "/metadata/name"));
    let created = json!(age(o, "/metadata/creationTimestamp"));
    match res.kind {
        "Pod" => vec![name, json!(pod_ready(o)), json!(pod_status(o)), json!(pod_restarts(o)), created,
            json!(or_none(str_at(o, "/status/podIP"))), json!(or_none(str_at(o, "/spec/nodeName")))],
        "Deployment" => vec![name, json!(format!("{}/{}", int_at(o, "/status/readyReplicas"), int_at(o, "/spec/replicas"))),
            json!(int_at(o, "/status/updatedReplicas")), json!(int_at(o, "/status/availableReplicas")), created,
            json!(containers(o, "/spec/template/spec/containers", "/name")),
            json!(containers(o, "/spec/template/spec/containers", "/image")), json!(selector_string(o))],
        "ReplicaSet" | "ReplicationController" => vec![name, json!(int_at(o, "/spec/replicas")), json!(int_at(o, "/status/replicas")),
            json!(int_at(o, "/status/readyReplicas")), created,
            json!(containers(o, "/spec/template/spec/containers", "/name")),
            json!(containers(o, "/spec/template/spec/containers", "/image")), json!(selector_string(o))],
        "Node" => {
            let ip = o.at("/status/addresses").and_then(Value::as_array)
                .and_then(|a| a.iter().find(|x| x["type"] == "InternalIP")).map(|a| str_at(a, "/address")).unwrap_or("");
            vec![name, json!(node_status(o)), json!(node_roles(o)), created, json!(str_at(o, "/status/nodeInfo/kubeletVersion")),
                json!(or_none(ip)), json!(or_none(str_at(o, "/status/nodeInfo/osImage")))]
        }
        "Service" => vec![name, json!(str_at(o, "/spec/type")), json!(or_none(str_at(o, "/spec/clusterIP"))), json!(external_ip(o)),
            json!(service_ports(o)), created,
            json!(o.at("/spec/selector").and_then(Value::as_object).map(|m| m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect::<Vec<_>>().join(",")).unwrap_or_else(|| "<none>".into()))],
        "Endpoints" => vec![name, json!(endpoints(o)), created],
        "Namespace" => vec![name, json!(str_at(o, "/status/phase")), created],
        "Event" => {
            let seen = if o.at("/lastTimestamp").is_some_and(Value::is_string) { "/lastTimestamp" } else { "/metadata/creationTimestamp" };
            vec![json!(age(o, seen)), json!(str_at(o, "/type")), json!(str_at(o, "/reason")),
                json!(format!("{}/{}", str_at(o, "/involvedObject/kind").to_lowercase(), str_at(o, "/involvedObject/name"))),
                json!(str_at(o, "/message"))]
        }
        "Lease" => vec![name, json!(or_none(str_at(o, "/spec/holderIdentity"))), created],
        "CertificateSigningRequest" => vec![name, created, json!(str_at(o, "/spec/signerName")),
            json!(str_at(o, "/spec/username")), json!(csr_requested_duration(o)), json!(csr_condition(o))],
        "EndpointSlice" => vec![name, json!(str_at(o, "/addressType")), json!(slice_ports(o)), json!(slice_endpoints(o)), created],
        "PodDisruptionBudget" => vec![name, json!(int_or_percent(o, "/spec/minAvailable")),
            json!(int_or_percent(o, "/spec/maxUnavailable")), json!(int_at(o, "/status/disruptionsAllowed")), created],
        "ConfigMap" => vec![name, json!(entries(o, "/data") + entries(o, "/binaryData")), created],
        "Secret" => vec![name, json!(str_at(o, "/type")), json!(entries(o, "/data")), created],
        "ServiceAccount" => vec![name, json!(o.at("/secrets").and_then(Value::as_array).map_or(0, Vec::len)), created],
        "CustomResourceDefinition" | "Role" | "ClusterRole" => vec![name, json!(str_at(o, "/metadata/creationTimestamp"))],
        "RoleBinding" | "ClusterRoleBinding" => {
            let subjects = |kind: &str| -> String {
                let names: Vec<String> = o.at("/subjects").and_then(Value::as_array).into_iter().flatten()
                    .filter(|x| str_at(x, "/kind") == kind)
                    .map(|x| match str_at(x, "/namespace") {
                        "" => str_at(x, "/name").to_string(),
                        ns => format!("{ns}/{}", str_at(x, "/name")),
                    })
                    .collect();
                names.join(", ")
            };
            vec![name, json!(format!("{}/{}", str_at(o, "/roleRef/kind"), str_at(o, "/roleRef/name"))), created,
                json!(subjects("User")), json!(subjects("Group")), json!(subjects("ServiceAccount"))]
        }
        "Job" => vec![name, json!(job_status(o)), json!(job_completions(o)), json!(job_duration(o)), created,
            json!(containers(o, "/spec/template/spec/containers", "/name")),
            json!(containers(o, "/spec/template/spec/containers", "/image")), json!(selector_string(o))],
        "CronJob" => {
            let last = if o.at("/status/lastScheduleTime").is_some_and(Value::is_string) {
                age(o, "/status/lastScheduleTime")
            } else {
                "<none>".into()
            };
            let template = "/spec/jobTemplate/spec/template/spec/containers";
            vec![name, json!(str_at(o, "/spec/schedule")), json!(or_none(str_at(o, "/spec/timeZone"))),
                json!(o.at("/spec/suspend").and_then(Value::as_bool).unwrap_or(false)),
                json!(o.at("/status/active").and_then(Value::as_array).map_or(0, Vec::len)), json!(last), created,
                json!(containers(o, template, "/name")), json!(containers(o, template, "/image")),
                json!("<none>")]
        }
        "DaemonSet" => vec![name, json!(int_at(o, "/status/desiredNumberScheduled")), json!(int_at(o, "/status/currentNumberScheduled")),
            json!(int_at(o, "/status/numberReady")), json!(int_at(o, "/status/updatedNumberScheduled")),
            json!(int_at(o, "/status/numberAvailable")), json!(node_selector(o)), created,
            json!(containers(o, "/spec/template/spec/containers", "/name")),
            json!(containers(o, "/spec/template/spec/containers", "/image")), json!(selector_string(o))],
        "StatefulSet" => vec![name, json!(format!("{}/{}", int_at(o, "/status/readyReplicas"), int_at(o, "/spec/replicas"))), created,
            json!(containers(o, "/spec/template/spec/containers", "/name")),
            json!(containers(o, "/spec/template/spec/containers", "/image"))],
        "ControllerRevision" => {
            let controller = o.at("/metadata/ownerReferences").and_then(Value::as_array)
                .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
                .map(|r| {
                    let group = str_at(r, "/apiVersion").split_once('/').map_or("", |(g, _)| g);
                    let kind = str_at(r, "/kind").to_ascii_lowercase();
                    let kind = if group.is_empty() { kind } else { format!("{kind}.{group}") };
                    format!("{kind}/{}", str_at(r, "/name"))
                })
                .unwrap_or_else(|| "<none>".into());
            vec![name, json!(controller), json!(int_at(o, "/revision")), created]
        }
        "HorizontalPodAutoscaler" => {
            let min = o.at("/spec/minReplicas").and_then(Value::as_i64).map_or("<unset>".to_string(), |m| m.to_string());
            vec![name, json!(format!("{}/{}", str_at(o, "/spec/scaleTargetRef/kind"), str_at(o, "/spec/scaleTargetRef/name"))),
                json!(hpa_targets(o)), json!(min), json!(int_at(o, "/spec/maxReplicas")), json!(int_at(o, "/status/currentReplicas")),
                created]
        }
        _ => vec![name, created],
    }
}

/// An autoscaler's metrics as kubectl shows them: `cpu: 80%/50%` (current/target), `<unknown>`
/// before a value is known, the first two metrics and a count of the rest.
pub fn hpa_targets(hpa: &Value) -> String {
    let specs = hpa.at("/spec/metrics").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let statuses = hpa.at("/status/currentMetrics").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let mut parts: Vec<String> = Vec::new();
    for (n, m) in specs.iter().enumerate().take(2) {
        let resource = str_at(m, "/resource/name");
        let current = statuses.get(n).filter(|c| str_at(c, "/resource/name") == resource);
        let text = match str_at(m, "/resource/target/type") {
            "Utilization" => {
                let now = current.and_then(|c| c.at("/resource/current/averageUtilization")).and_then(Value::as_i64);
                let now = now.map_or("<unknown>".to_string(), |u| format!("{u}%"));
                format!("{now}/{}%", int_at(m, "/resource/target/averageUtilization"))
            }
            _ => {
                let now = current.and_then(|c| c.at("/resource/current/averageValue")).and_then(Value::as_str);
                format!("{}/{}", now.unwrap_or("<unknown>"), str_at(m, "/resource/target/averageValue"))
            }
        };
        parts.push(if m["type"] == "Resource" { format!("{resource}: {text}") } else { text });
    }
    if specs.len() > 2 {
        parts.push(format!("+ {} more...", specs.len() - 2));
    }
    parts.join(", ")
}

/// A DaemonSet's template `nodeSelector` as `k=v,...` in key order, `<none>` when empty.
fn node_selector(ds: &Value) -> String {
    let Some(m) = ds.at("/spec/template/spec/nodeSelector").and_then(Value::as_object).filter(|m| !m.is_empty()) else {
        return "<none>".into();
    };
    let mut pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect();
    pairs.sort();
    pairs.join(",")
}

/// A `meta.k8s.io/v1` Table of `objects`; each row carries the object's metadata, so kubectl can
/// show namespaces and labels.
pub fn table(res: &ResourceInfo, objects: &[Value], resource_version: &str) -> Value {
    if let Some(custom) = shepherd_api::kinds::custom(res) {
        return crate::crd::table(&custom, objects, resource_version);
    }
    let defs: Vec<Value> = columns(res)
        .into_iter()
        .map(|(n, t, p)| json!({"name": n, "type": t, "format": if n == "Name" { "name" } else { "" }, "description": "", "priority": p}))
        .collect();
    let rows: Vec<Value> = objects.iter().map(|o| row(cells(res, o), o)).collect();
    envelope(defs, rows, resource_version)
}

/// One row of a Table: its cells, and the object's metadata for kubectl's namespace and label columns.
pub(crate) fn row(cells: Vec<Value>, obj: &Value) -> Value {
    json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({}))}})
}

/// The `meta.k8s.io/v1` Table around column definitions and rows.
pub(crate) fn envelope(defs: Vec<Value>, rows: Vec<Value>, resource_version: &str) -> Value {
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": defs, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn autoscaler_targets_read_as_kubectl_prints_them() {
        let mut hpa = json!({"spec": {"metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}}]}});
        assert_eq!(hpa_targets(&hpa), "cpu: <unknown>/50%, memory: <unknown>/100Mi");
        hpa["status"] = json!({"currentMetrics": [
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 80, "averageValue": "160m"}}},
            {"type": "Resource", "resource": {"name": "memory", "current": {"averageValue": "12Mi"}}}]});
        assert_eq!(hpa_targets(&hpa), "cpu: 80%/50%, memory: 12Mi/100Mi");
    }

    #[test]
    fn pod_rows_show_readiness_status_and_restarts() {
        let pod = json!({"metadata": {"name": "web-0"}, "spec": {"containers": [{"name": "c"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.5", "containerStatuses": [
                {"ready": false, "restartCount": 4, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        let t = table(&shepherd_api::kinds::POD, &[pod], "9");
        let row = &t["rows"][0]["cells"];
        assert_eq!(row[0], "web-0");
        assert_eq!(row[1], "0/1");
        assert_eq!(row[2], "CrashLoopBackOff");
        assert_eq!(row[3], 4);
        assert_eq!(row[6], "n1");
    }

    #[test]
    fn pod_status_reads_as_kubectl_prints_it() {
        let pod = |phase: &str, states: Value| {
            let statuses: Vec<Value> = states.as_array().into_iter().flatten().map(|s| json!({"state": s, "ready": s.get("running").is_some()})).collect();
            json!({"metadata": {"name": "p"}, "status": {"phase": phase, "containerStatuses": statuses}})
        };
        let done = json!({"terminated": {"exitCode": 0, "reason": "Completed"}});
        let failed = json!({"terminated": {"exitCode": 2, "reason": "Error"}});
        let running = json!({"running": {}});
        // A finished Job's pod reads Completed, a failed one Error.
        assert_eq!(pod_status(&pod("Succeeded", json!([done]))), "Completed");
        assert_eq!(pod_status(&pod("Failed", json!([failed]))), "Error");
        assert_eq!(pod_status(&pod("Failed", json!([{"terminated": {"exitCode": 3}}]))), "ExitCode:3");
        assert_eq!(pod_status(&pod("Failed", json!([{"terminated": {"exitCode": 137, "signal": 9}}]))), "Signal:9");
        // A container that finished beside one still running: the pod is Running (NotReady without
        // a Ready condition).
        let mut both = pod("Running", json!([running, done]));
        assert_eq!(pod_status(&both), "NotReady");
        both["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
        assert_eq!(pod_status(&both), "Running");
        assert_eq!(pod_status(&pod("Pending", json!([{"waiting": {"reason": "ContainerCreating"}}]))), "ContainerCreating");
        // Deleting: Terminating, unless it had finished; Unknown for a lost node's pod.
        let mut finished = pod("Succeeded", json!([done]));
        finished["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(pod_status(&finished), "Completed");
        let mut deleting = pod("Running", json!([running]));
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(pod_status(&deleting), "Terminating");
        deleting["status"]["reason"] = json!("NodeLost");
        assert_eq!(pod_status(&deleting), "Unknown");
        assert_eq!(pod_status(&json!({"status": {}})), "Unknown");
    }

    #[test]
    fn endpoint_slice_rows_list_ports_and_addresses_as_kubectl_does() {
        let slice = json!({"metadata": {"name": "web-abc"}, "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": (1..=5).map(|n| json!({"addresses": [format!("10.0.0.{n}")]})).collect::<Vec<_>>()});
        let t = table(&shepherd_api::kinds::ENDPOINTSLICE, &[slice], "1");
        let row = &t["rows"][0]["cells"];
        assert_eq!(row[1], "IPv4");
        assert_eq!(row[2], "8080");
        assert_eq!(row[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 2 more...");
        let empty = table(&shepherd_api::kinds::ENDPOINTSLICE, &[json!({"addressType": "IPv4"})], "1");
        assert_eq!(empty["rows"][0]["cells"][2], "<unset>");
        assert_eq!(empty["rows"][0]["cells"][3], "<unset>");
    }

    #[test]
    fn pod_disruption_budget_rows_show_na_for_the_unset_bound() {
        let pdb = json!({"metadata": {"name": "web"}, "spec": {"minAvailable": 2}, "status": {"disruptionsAllowed": 1}});
        let row = &table(&shepherd_api::kinds::PODDISRUPTIONBUDGET, &[pdb], "1")["rows"][0]["cells"];
        assert_eq!((row[1].as_str(), row[2].as_str(), row[3].as_i64()), (Some("2"), Some("N/A"), Some(1)));
    }
}
