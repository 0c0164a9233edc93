//! What a pod asks of a node and what a node offers, in typed form, with the filter and score
//! functions over them. Parsed once per pod and once per node change, never per (pod, node) pair.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;
use shepherd_api::{JsonPath, pod};
use shepherd_api::quantity::{self, cpu_millis, memory_bytes};

/// Scoring stand-ins for a container that requests nothing, so such pods still spread (the
/// values Kubernetes uses: 100 millicores, 200 MiB).
const DEFAULT_CPU_MILLIS: i64 = 100;
const DEFAULT_MEMORY_BYTES: i64 = 200 * 1024 * 1024;
/// A node that does not report `allocatable.pods` takes the node agent default.
const DEFAULT_MAX_PODS: i64 = 110;

/// CPU in millicores, memory in bytes, and a pod count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Resources {
    pub cpu: i64,
    pub memory: i64,
    pub pods: i64,
}

impl Resources {
    pub fn add(&mut self, other: &Resources) {
        self.cpu += other.cpu;
        self.memory += other.memory;
        self.pods += other.pods;
    }

    pub fn sub(&mut self, other: &Resources) {
        self.cpu -= other.cpu;
        self.memory -= other.memory;
        self.pods -= other.pods;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl Effect {
    fn parse(s: &str) -> Option<Effect> {
        match s {
            "NoSchedule" => Some(Effect::NoSchedule),
            "PreferNoSchedule" => Some(Effect::PreferNoSchedule),
            "NoExecute" => Some(Effect::NoExecute),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taint {
    pub key: String,
    pub value: String,
    pub effect: Effect,
}

/// The scheduling-relevant part of a Node. Two summaries compare equal when nothing a pod's
/// placement depends on changed (heartbeats do not change it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeSummary {
    pub ready: bool,
    pub unschedulable: bool,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub allocatable: Resources,
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

/// A quantity that fails to parse counts as zero: the API server validated it, and a node that
/// reports nonsense should offer nothing rather than stop the scheduler.
fn quantity(v: Option<&Value>, parse: fn(&str) -> Result<i64, String>) -> Option<i64> {
    parse(&quantity::text(v?)?).ok()
}

impl NodeSummary {
    pub fn of(node: &Value) -> NodeSummary {
        let ready = node
            .at("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c.get("type").and_then(Value::as_str) == Some("Ready")))
            .and_then(|c| c.get("status").and_then(Value::as_str))
            == Some("True");
        let taints = taints_of(node);
        let alloc = node.at("/status/allocatable").or_else(|| node.at("/status/capacity"));
        let field = |name: &str| alloc.and_then(|a| a.get(name));
        let allocatable = Resources {
            cpu: quantity(field("cpu"), cpu_millis).unwrap_or(0),
            memory: quantity(field("memory"), memory_bytes).unwrap_or(0),
            // A pod count is a quantity at scale 0, like bytes.
            pods: quantity(field("pods"), memory_bytes).unwrap_or(DEFAULT_MAX_PODS),
        };
        NodeSummary {
            ready,
            unschedulable: node.at("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false),
            labels: string_map(node.at("/metadata/labels")),
            taints,
            allocatable,
        }
    }
}

/// What one pod occupies on its node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// As requested (what fits against allocatable).
    pub requests: Resources,
    /// With the scoring defaults for containers that request nothing.
    pub scoring: Resources,
    /// The uid of the controlling owner, for spreading.
    pub owner: Option<String>,
}

impl Usage {
    pub fn of(pod: &Value) -> Usage {
        let mut requests = Resources { pods: 1, ..Default::default() };
        let mut scoring = Resources { pods: 1, ..Default::default() };
        for c in pod.at("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
            let cpu = pod::container_request(c, "cpu", cpu_millis);
            let memory = pod::container_request(c, "memory", memory_bytes);
            requests.cpu += cpu.unwrap_or(0);
            requests.memory += memory.unwrap_or(0);
            scoring.cpu += cpu.filter(|c| *c > 0).unwrap_or(DEFAULT_CPU_MILLIS);
            scoring.memory += memory.filter(|m| *m > 0).unwrap_or(DEFAULT_MEMORY_BYTES);
        }
        let owner = shepherd_runtime::cache::controller_owner(pod).map(|(_, _, uid)| uid.to_string());
        Usage { requests, scoring, owner }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TolerationOp {
    Exists,
    Equal(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Toleration {
    /// Empty with `Exists` tolerates every taint.
    key: String,
    op: TolerationOp,
    /// `None` tolerates every effect.
    effect: Option<Effect>,
    /// How long a `NoExecute` taint is tolerated; `None`: for ever.
    pub seconds: Option<i64>,
}

/// A node's taints; malformed ones (no key, unknown effect) are skipped.
pub(crate) fn taints_of(node: &Value) -> Vec<Taint> {
    node.at("/spec/taints")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| {
                    Some(Taint {
                        key: t.get("key")?.as_str()?.to_string(),
                        value: t.get("value").and_then(Value::as_str).unwrap_or("").to_string(),
                        effect: Effect::parse(t.get("effect")?.as_str()?)?,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A pod's tolerations; ones with an unknown operator or effect are skipped.
pub(crate) fn tolerations_of(pod: &Value) -> Vec<Toleration> {
    pod.at("/spec/tolerations")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .filter_map(|t| {
                    let key = t.get("key").and_then(Value::as_str).unwrap_or("").to_string();
                    let op = match t.get("operator").and_then(Value::as_str).unwrap_or("Equal") {
                        "Exists" => TolerationOp::Exists,
                        "Equal" => TolerationOp::Equal(t.get("value").and_then(Value::as_str).unwrap_or("").to_string()),
                        _ => return None,
                    };
                    let effect = match t.get("effect").and_then(Value::as_str).unwrap_or("") {
                        "" => None,
                        e => Some(Effect::parse(e)?),
                    };
                    let seconds = t.get("tolerationSeconds").and_then(Value::as_i64);
                    Some(Toleration { key, op, effect, seconds })
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Toleration {
    pub(crate) fn tolerates(&self, t: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != t.effect) {
            return false;
        }
        match &self.op {
            TolerationOp::Exists => self.key.is_empty() || self.key == t.key,
            TolerationOp::Equal(v) => self.key == t.key && *v == t.value,
        }
    }
}

#[derive(Debug, Clone)]
enum NodeOp {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
    /// An operator or value the scheduler cannot read: the expression matches no node.
    Never,
}

#[derive(Debug, Clone)]
struct NodeRequirement {
    key: String,
    /// `matchFields` (only `metadata.name`) rather than `matchExpressions` on labels.
    field: bool,
    op: NodeOp,
}

impl NodeRequirement {
    fn parse(e: &Value, field: bool) -> NodeRequirement {
        let key = e.get("key").and_then(Value::as_str).unwrap_or("").to_string();
        let values: Vec<String> =
            e.get("values").and_then(Value::as_array).map(|vs| vs.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default();
        let number = || if values.len() == 1 { values[0].parse::<i64>().ok() } else { None };
        let op = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
            "In" => NodeOp::In(values.clone()),
            "NotIn" => NodeOp::NotIn(values.clone()),
            "Exists" => NodeOp::Exists,
            "DoesNotExist" => NodeOp::DoesNotExist,
            "Gt" => number().map(NodeOp::Gt).unwrap_or(NodeOp::Never),
            "Lt" => number().map(NodeOp::Lt).unwrap_or(NodeOp::Never),
            _ => NodeOp::Never,
        };
        NodeRequirement { key, field, op }
    }

    fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let got = if self.field {
            (self.key == "metadata.name").then_some(name)
        } else {
            labels.get(&self.key).map(String::as_str)
        };
        match &self.op {
            NodeOp::In(vs) => got.is_some_and(|g| vs.iter().any(|v| v == g)),
            NodeOp::NotIn(vs) => !got.is_some_and(|g| vs.iter().any(|v| v == g)),
            NodeOp::Exists => got.is_some(),
            NodeOp::DoesNotExist => got.is_none(),
            NodeOp::Gt(n) => got.and_then(|g| g.parse::<i64>().ok()).is_some_and(|g| g > *n),
            NodeOp::Lt(n) => got.and_then(|g| g.parse::<i64>().ok()).is_some_and(|g| g < *n),
            NodeOp::Never => false,
        }
    }
}

/// Why a node cannot take a pod, worded as in Kubernetes' scheduling failure messages. A taint
/// borrows its key and value from the node, so turning a node down allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Unfit<'a> {
    Unschedulable,
    NotReady,
    Taint { key: &'a str, value: &'a str },
    NodeAffinity,
    Insufficient(&'static str),
    TooManyPods,
}

impl fmt::Display for Unfit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unfit::Unschedulable => write!(f, "node(s) were unschedulable"),
            Unfit::NotReady => write!(f, "node(s) were not ready"),
            Unfit::Taint { key, value } => write!(f, "node(s) had untolerated taint {{{key}: {value}}}"),
            Unfit::NodeAffinity => write!(f, "node(s) didn't match Pod's node affinity/selector"),
            Unfit::Insufficient(r) => write!(f, "Insufficient {r}"),
            Unfit::TooManyPods => write!(f, "Too many pods"),
        }
    }
}

/// Everything the filters need to know about one pod.
#[derive(Debug, Clone)]
pub(crate) struct PodNeeds {
    pub name: String,
    pub usage: Usage,
    tolerations: Vec<Toleration>,
    node_selector: Vec<(String, String)>,
    /// `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`: any term may match, all
    /// requirements of a term must. `None` when the pod has no required node affinity.
    affinity_terms: Option<Vec<Vec<NodeRequirement>>>,
}

impl PodNeeds {
    pub fn of(pod: &Value) -> PodNeeds {
        let tolerations = tolerations_of(pod);
        let node_selector = string_map(pod.at("/spec/nodeSelector")).into_iter().collect();
        let affinity_terms = pod
            .at("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
            .and_then(Value::as_array)
            .map(|terms| {
                terms
                    .iter()
                    .map(|term| {
                        let list = |name: &str, field: bool| {
                            term.get(name)
                                .and_then(Value::as_array)
                                .into_iter()
                                .flatten()
                                .map(move |e| NodeRequirement::parse(e, field))
                                .collect::<Vec<_>>()
                        };
                        let mut reqs = list("matchExpressions", false);
                        reqs.extend(list("matchFields", true));
                        reqs
                    })
                    .collect()
            });
        PodNeeds {
            name: pod.at("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string(),
            usage: Usage::of(pod),
            tolerations,
            node_selector,
            affinity_terms,
        }
    }

    fn matches_node_labels(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        if !self.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            return false;
        }
        match &self.affinity_terms {
            None => true,
            // An empty term matches nothing, as in Kubernetes.
            Some(terms) => terms.iter().any(|t| !t.is_empty() && t.iter().all(|r| r.matches(name, labels))),
        }
    }

    /// Whether a node named `name` passes this pod's `nodeSelector` and required node affinity.
    pub fn matches_node(&self, name: &str, node: &NodeSummary) -> bool {
        self.matches_node_labels(name, &node.labels)
    }

    /// Whether this pod tolerates every taint of `node` with one of `effects`.
    pub fn tolerates_taints(&self, node: &NodeSummary, effects: &[Effect]) -> bool {
        node.taints.iter().filter(|t| effects.contains(&t.effect)).all(|t| self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    /// Whether `node` can take this pod given what is already `requested` there. When it cannot,
    /// `reject` hears every reason that applies, in the order the checks ran (resource shortages
    /// all together). Runs for every node a pod is weighed against, so the reasons go to
    /// `reject` rather than into a fresh collection per node.
    pub fn filter<'n>(&self, name: &str, node: &'n NodeSummary, requested: &Resources, mut reject: impl FnMut(Unfit<'n>)) -> bool {
        if node.unschedulable {
            reject(Unfit::Unschedulable);
            return false;
        }
        if !node.ready {
            reject(Unfit::NotReady);
            return false;
        }
        for t in &node.taints {
            if matches!(t.effect, Effect::NoSchedule | Effect::NoExecute) && !self.tolerations.iter().any(|tol| tol.tolerates(t)) {
                reject(Unfit::Taint { key: &t.key, value: &t.value });
                return false;
            }
        }
        if !self.matches_node_labels(name, &node.labels) {
            reject(Unfit::NodeAffinity);
            return false;
        }
        let want = &self.usage.requests;
        let free = |alloc: i64, used: i64| alloc - used;
        let mut fits = true;
        if want.pods > free(node.allocatable.pods, requested.pods) {
            reject(Unfit::TooManyPods);
            fits = false;
        }
        if want.cpu > 0 && want.cpu > free(node.allocatable.cpu, requested.cpu) {
            reject(Unfit::Insufficient("cpu"));
            fits = false;
        }
        if want.memory > 0 && want.memory > free(node.allocatable.memory, requested.memory) {
            reject(Unfit::Insufficient("memory"));
            fits = false;
        }
        fits
    }

    /// Least-allocated plus balanced-allocation score, each 0..=100, from the scoring usage
    /// (`scoring_requested` on the node plus this pod).
    pub fn resource_score(&self, node: &NodeSummary, scoring_requested: &Resources) -> i64 {
        let fraction = |alloc: i64, used: i64, add: i64| {
            if alloc <= 0 { 1.0 } else { ((used + add) as f64 / alloc as f64).min(1.0) }
        };
        let cpu = fraction(node.allocatable.cpu, scoring_requested.cpu, self.usage.scoring.cpu);
        let mem = fraction(node.allocatable.memory, scoring_requested.memory, self.usage.scoring.memory);
        let least = ((1.0 - cpu) + (1.0 - mem)) * 50.0;
        let balanced = (1.0 - (cpu - mem).abs()) * 100.0;
        (least + balanced).round() as i64
    }
}

/// FNV-1a over the pod and node names: a tie-break that is stable across runs and processes and
/// still differs from pod to pod, so equal nodes share the load. The pod's half is hashed once
/// and every node continues from it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TieBreak(u64);

impl TieBreak {
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub fn new(pod: &str) -> TieBreak {
        TieBreak(Self::hash(0xcbf2_9ce4_8422_2325, pod.bytes().chain([0u8])))
    }

    pub fn node(self, node: &str) -> u64 {
        Self::hash(self.0, node.bytes())
    }

    fn hash(mut h: u64, bytes: impl Iterator<Item = u8>) -> u64 {
        for b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(Self::PRIME);
        }
        h
    }
}

/// "0/3 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint {k: v}."
/// Groups by reason, most frequent first (then alphabetically).
pub(crate) fn unschedulable_message(total_nodes: usize, reasons: &BTreeMap<Unfit<'_>, usize>) -> String {
    let mut groups: Vec<(usize, String)> = reasons.iter().map(|(r, n)| (*n, r.to_string())).collect();
    groups.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    if groups.is_empty() {
        return format!("0/{total_nodes} nodes are available.");
    }
    let parts: Vec<String> = groups.into_iter().map(|(n, r)| format!("{n} {r}")).collect();
    format!("0/{total_nodes} nodes are available: {}.", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(labels: Value, taints: Value) -> NodeSummary {
        NodeSummary::of(&json!({
            "metadata": {"name": "n", "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}]},
        }))
    }

    fn pod(spec: Value) -> PodNeeds {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "i", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}]);
        PodNeeds::of(&json!({"metadata": {"name": "p"}, "spec": spec}))
    }

    /// `filter` with the reasons collected: `Ok` when the node fits.
    fn check<'n>(pod: &PodNeeds, node: &'n NodeSummary, used: &Resources) -> Result<(), Vec<Unfit<'n>>> {
        let mut why = Vec::new();
        let fits = pod.filter("n", node, used, |r| why.push(r));
        assert_eq!(fits, why.is_empty(), "a node fits exactly when no reason is given");
        if fits { Ok(()) } else { Err(why) }
    }

    #[test]
    fn an_empty_key_with_exists_tolerates_every_taint() {
        let n = node(json!({}), json!([{"key": "a", "value": "b", "effect": "NoSchedule"}, {"key": "c", "effect": "NoExecute"}]));
        assert!(check(&pod(json!({"tolerations": [{"operator": "Exists"}]})), &n, &Resources::default()).is_ok());
        assert_eq!(
            check(&pod(json!({"tolerations": [{"key": "a", "operator": "Equal", "value": "b"}]})), &n, &Resources::default()),
            Err(vec![Unfit::Taint { key: "c", value: "" }])
        );
    }

    #[test]
    fn prefer_no_schedule_taints_do_not_filter() {
        let n = node(json!({}), json!([{"key": "a", "effect": "PreferNoSchedule"}]));
        assert!(check(&pod(json!({})), &n, &Resources::default()).is_ok());
    }

    #[test]
    fn gt_and_lt_compare_label_values_as_integers() {
        let n = node(json!({"cores": "16"}), json!([]));
        let aff = |op: &str, v: &str| {
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "cores", "operator": op, "values": [v]}]}]}}}})
        };
        assert!(check(&pod(aff("Gt", "8")), &n, &Resources::default()).is_ok());
        assert!(check(&pod(aff("Lt", "8")), &n, &Resources::default()).is_err());
        assert!(check(&pod(aff("Gt", "many")), &n, &Resources::default()).is_err());
    }

    #[test]
    fn every_short_resource_is_reported() {
        let n = node(json!({}), json!([]));
        let used = Resources { cpu: 1800, memory: 3 * 1024 * 1024 * 1024 + 1, pods: 0 };
        assert_eq!(check(&pod(json!({})), &n, &used), Err(vec![Unfit::Insufficient("cpu"), Unfit::Insufficient("memory")]));
    }

    #[test]
    fn the_message_lists_groups_by_count_then_name() {
        let mut reasons = BTreeMap::new();
        reasons.insert(Unfit::Taint { key: "k", value: "v" }, 1);
        reasons.insert(Unfit::Insufficient("cpu"), 2);
        assert_eq!(
            unschedulable_message(3, &reasons),
            "0/3 nodes are available: 2 Insufficient cpu, 1 node(s) had untolerated taint {k: v}."
        );
    }

    #[test]
    fn the_tie_break_hashes_pod_then_node_names() {
        // FNV-1a of "p\0n", written out.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in *b"p\0n" {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_eq!(TieBreak::new("p").node("n"), h);
        assert_ne!(TieBreak::new("p").node("n"), TieBreak::new("q").node("n"));
    }
}
