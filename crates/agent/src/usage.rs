//! Resource usage of the node and its containers (CPU as a rate over the last window, memory
//! as the working set), reported to the API server's `metrics.k8s.io` table every interval, as
//! kubelet's `/metrics/resource` is scraped by metrics-server.
//!
//! Real containers are measured from their cgroups (cumulative CPU time, so the rate is the
//! difference between two samples); a container without cgroups of its own (an agent not
//! running as root) from its main process in `/proc`. Simulated containers report synthetic,
//! deterministic values: the `shepherd.io/simulated-cpu` / `-memory` annotation of the pod when
//! set, else half the container's CPU request and its memory request.

use std::collections::HashMap;
use std::fs;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use serde_json::{Map, Value, json};
use shepherd_api::quantity::milli_value;
use shepherd_api::{JsonPath, kinds, pod};
use shepherd_runtime::Client;
use tracing::{debug, warn};

use crate::cgroup::Cgroups;
use crate::pods::{PodManager, k8s_time};
use crate::runtime::{ContainerId, Runtime};

/// Pod annotation: the CPU each container of a simulated pod uses (a quantity, `800m`).
pub const SIMULATED_CPU_ANNOTATION: &str = "shepherd.io/simulated-cpu";
/// Pod annotation: the memory each container of a simulated pod uses (a quantity, `64Mi`).
pub const SIMULATED_MEMORY_ANNOTATION: &str = "shepherd.io/simulated-memory";
/// Memory of a simulated container that requests none.
const SIMULATED_MEMORY_DEFAULT: u64 = 4 * 1024 * 1024;

/// Where usage comes from.
pub(crate) enum Source {
    Measured(Cgroups),
    Synthetic,
}

/// One container's usage over the last window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ContainerUsage {
    pub name: String,
    pub nanocores: u64,
    pub memory_bytes: u64,
}

/// Samples usage; keeps the previous cumulative CPU times to turn them into rates.
pub(crate) struct Sampler {
    source: Source,
    /// Cumulative CPU nanoseconds of each container at its last sample, and when.
    previous: HashMap<ContainerId, (u64, Instant)>,
    node_previous: Option<(u64, Instant)>,
}

fn quantity_annotation(pod: &Value, key: &str) -> Option<i128> {
    pod.at(&format!("/metadata/annotations/{}", key.replace('/', "~1")))
        .and_then(Value::as_str)
        .and_then(|q| milli_value(q).ok())
}

/// A simulated container's usage: what its pod's annotations say, else half its CPU request
/// and its memory request.
fn synthetic(pod: &Value, name: &str) -> ContainerUsage {
    let container = pod
        .at("/spec/containers")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .cloned()
        .unwrap_or(Value::Null);
    let cpu_milli = quantity_annotation(pod, SIMULATED_CPU_ANNOTATION)
        .or_else(|| pod::container_request_milli(&container, "cpu").map(|r| r / 2))
        .unwrap_or(1);
    let memory_milli = quantity_annotation(pod, SIMULATED_MEMORY_ANNOTATION)
        .or_else(|| pod::container_request_milli(&container, "memory"))
        .unwrap_or(SIMULATED_MEMORY_DEFAULT as i128 * 1000);
    ContainerUsage {
        name: name.to_string(),
        nanocores: u64::try_from(cpu_milli.max(0) * 1_000_000).unwrap_or(u64::MAX),
        memory_bytes: u64::try_from(memory_milli.max(0) / 1000).unwrap_or(u64::MAX),
    }
}

/// Clock ticks per second of `/proc`'s CPU times.
fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

/// CPU time of a process and its waited-for children, and its resident memory, from `/proc`.
fn process_usage(pid: u32) -> (Option<u64>, Option<u64>) {
    let cpu = fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|stat| {
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
        let ticks = f.get(11)? + f.get(12)? + f.get(13)? + f.get(14)?;
        Some(ticks * 1_000_000_000 / clock_ticks())
    });
    let rss = fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()))
        .map(|kb| kb * 1024);
    (cpu, rss)
}

/// The node's busy CPU time (everything but idle and iowait) and its memory in use.
fn node_usage() -> (Option<u64>, Option<u64>) {
    let cpu = fs::read_to_string("/proc/stat").ok().and_then(|s| {
        let line = s.lines().next()?.strip_prefix("cpu ")?;
        let f: Vec<u64> = line.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
        // user nice system idle iowait irq softirq steal (guest time is already in user).
        let busy: u64 = f.iter().take(8).enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
        Some(busy * 1_000_000_000 / clock_ticks())
    });
    let memory = fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        let kb = |key: &str| s.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
        Some(kb("MemTotal:")?.saturating_sub(kb("MemAvailable:")?) * 1024)
    });
    (cpu, memory)
}

/// Nanocores from two cumulative CPU times `elapsed` apart; `None` when the counter went back
/// (a restarted container) or no time passed.
fn rate(before: u64, after: u64, elapsed: Duration) -> Option<u64> {
    let secs = elapsed.as_secs_f64();
    (after >= before && secs > 0.0).then(|| ((after - before) as f64 / secs) as u64)
}

impl Sampler {
    pub fn new(source: Source) -> Self {
        Sampler { source, previous: HashMap::new(), node_previous: None }
    }

    /// The usage of each running container with a rate (containers seen for the first time
    /// have none until the next sample), by pod.
    pub fn sample(
        &mut self,
        runtime: &dyn Runtime,
        pods: &[(Arc<Value>, Vec<ContainerId>)],
        now: Instant,
    ) -> Vec<Vec<ContainerUsage>> {
        let mut seen: HashMap<ContainerId, (u64, Instant)> = HashMap::new();
        let mut out = Vec::with_capacity(pods.len());
        for (pod, ids) in pods {
            let mut usages = Vec::with_capacity(ids.len());
            for id in ids {
                let usage = match &self.source {
                    Source::Synthetic => Some(synthetic(pod, &id.name)),
                    Source::Measured(cgroups) => runtime.pid(id).and_then(|pid| {
                        let measured = cgroups.usage_of_pid(pid);
                        let (cpu, memory) = match (measured.cpu_ns, measured.memory_bytes) {
                            (Some(c), Some(m)) => (Some(c), Some(m)),
                            (c, m) => {
                                let (pc, pm) = process_usage(pid);
                                (c.or(pc), m.or(pm))
                            }
                        };
                        let cpu = cpu?;
                        seen.insert(id.clone(), (cpu, now));
                        let (before, at) = self.previous.get(id)?;
                        Some(ContainerUsage {
                            name: id.name.clone(),
                            nanocores: rate(*before, cpu, now.duration_since(*at))?,
                            memory_bytes: memory.unwrap_or(0),
                        })
                    }),
                };
                if let Some(u) = usage {
                    usages.push(u);
                }
            }
            out.push(usages);
        }
        self.previous = seen;
        out
    }

    /// The node's own usage (measured nodes only); `None` on the first sample.
    pub fn node(&mut self, now: Instant) -> Option<(u64, u64)> {
        if matches!(self.source, Source::Synthetic) {
            return None;
        }
        let (cpu, memory) = node_usage();
        let cpu = cpu?;
        let previous = self.node_previous.replace((cpu, now));
        let (before, at) = previous?;
        Some((rate(before, cpu, now.duration_since(at))?, memory.unwrap_or(0)))
    }
}

fn quantities(nanocores: u64, memory_bytes: u64) -> Value {
    json!({"cpu": format!("{nanocores}n"), "memory": format!("{}Ki", memory_bytes / 1024)})
}

/// The reports of `nodes`: each a NodeMetrics with its pods' PodMetrics under `pods`. A
/// simulated node's usage is the sum of its pods'.
fn reports(
    nodes: &[String],
    pods: &[(Arc<Value>, Vec<ContainerId>)],
    usages: &[Vec<ContainerUsage>],
    node_usage: Option<(u64, u64)>,
    window: Duration,
) -> Vec<Value> {
    let timestamp = k8s_time(Timestamp::now());
    let window = format!("{:.3}s", window.as_secs_f64());
    let mut by_node: HashMap<&str, (Vec<Value>, u64, u64)> = nodes.iter().map(|n| (n.as_str(), (Vec::new(), 0, 0))).collect();
    for ((pod, ids), usage) in pods.iter().zip(usages) {
        // A pod is reported once every running container has a rate, as metrics-server skips
        // pods with containers it could not measure.
        if usage.is_empty() || usage.len() != ids.len() {
            continue;
        }
        let node = pod.at("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
        let Some((list, cpu, memory)) = by_node.get_mut(node) else { continue };
        let containers: Vec<Value> =
            usage.iter().map(|u| json!({"name": u.name, "usage": quantities(u.nanocores, u.memory_bytes)})).collect();
        *cpu += usage.iter().map(|u| u.nanocores).sum::<u64>();
        *memory += usage.iter().map(|u| u.memory_bytes).sum::<u64>();
        let labels = pod.at("/metadata/labels").cloned().unwrap_or_else(|| Value::Object(Map::new()));
        list.push(json!({
            "metadata": {"name": pod.at("/metadata/name"), "namespace": pod.at("/metadata/namespace"), "labels": labels},
            "timestamp": timestamp, "window": window, "containers": containers,
        }));
    }
    nodes
        .iter()
        .filter_map(|n| {
            let (pods, cpu, memory) = by_node.remove(n.as_str())?;
            let (cpu, memory) = node_usage.unwrap_or((cpu, memory));
            Some(json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetrics", "metadata": {"name": n},
                "timestamp": timestamp, "window": window, "usage": quantities(cpu, memory), "pods": pods}))
        })
        .collect()
}

/// Nodes per report request of an agent that stands in for many: one `NodeMetricsList` of at most
/// this many NodeMetrics (with their pods, well under the server's 4 MiB bound for a report).
const NODES_PER_REPORT: usize = 100;

/// The request bodies that carry `reports`: a single node's NodeMetrics as it is, several nodes'
/// in `NodeMetricsList`s of up to `NODES_PER_REPORT`.
fn batches(reports: Vec<Value>) -> Vec<Value> {
    if reports.len() <= 1 {
        return reports;
    }
    let mut reports = reports.into_iter().peekable();
    let mut out = Vec::new();
    while reports.peek().is_some() {
        let items: Vec<Value> = reports.by_ref().take(NODES_PER_REPORT).collect();
        out.push(json!({"apiVersion": "metrics.k8s.io/v1beta1", "kind": "NodeMetricsList", "items": items}));
    }
    out
}

/// Samples every `interval` and sends the nodes' reports, until the task is dropped.
pub(crate) async fn report(client: Arc<dyn Client>, pods: Arc<PodManager>, nodes: Vec<String>, source: Source, interval: Duration) {
    let mut sampler = Sampler::new(source);
    let mut last = Instant::now();
    let mut failing = false;
    loop {
        let running = pods.running_containers().await;
        let now = Instant::now();
        let usages = sampler.sample(pods.runtime().as_ref(), &running, now);
        let node = sampler.node(now);
        for body in batches(reports(&nodes, &running, &usages, node, now.duration_since(last))) {
            match client.create(&kinds::NODE_METRICS, None, body).await {
                Ok(_) => failing = false,
                // An API server without the metrics table, or one restarting: logged once per outage.
                Err(e) if !failing => {
                    failing = true;
                    warn!(error = %e, "cannot report resource usage to the API server");
                }
                Err(e) => debug!(error = %e, "cannot report resource usage"),
            }
        }
        last = now;
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> ContainerId {
        ContainerId { pod_key: "default/web".into(), pod_uid: "u1".into(), name: name.into() }
    }

    #[test]
    fn simulated_containers_use_half_their_cpu_request_unless_annotated() {
        let pod = json!({"metadata": {"name": "web"}, "spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}}, {"name": "b"}]}});
        assert_eq!(synthetic(&pod, "a"), ContainerUsage { name: "a".into(), nanocores: 100_000_000, memory_bytes: 64 << 20 });
        assert_eq!(synthetic(&pod, "b").nanocores, 1_000_000);
        let mut busy = pod.clone();
        busy["metadata"]["annotations"] = json!({SIMULATED_CPU_ANNOTATION: "1500m", SIMULATED_MEMORY_ANNOTATION: "1Gi"});
        assert_eq!(synthetic(&busy, "a"), ContainerUsage { name: "a".into(), nanocores: 1_500_000_000, memory_bytes: 1 << 30 });
    }

    #[test]
    fn a_rate_needs_two_samples_and_a_counter_that_did_not_go_back() {
        assert_eq!(rate(1_000_000_000, 3_000_000_000, Duration::from_secs(4)), Some(500_000_000));
        assert_eq!(rate(3, 2, Duration::from_secs(1)), None);
        assert_eq!(rate(1, 2, Duration::ZERO), None);
    }

    #[test]
    fn reports_group_pods_by_node_and_skip_pods_not_fully_measured() {
        let pod = |name: &str, node: &str| {
            Arc::new(json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
                "spec": {"nodeName": node, "containers": [{"name": "a"}, {"name": "b"}]}}))
        };
        let u = |name: &str, m: u64| ContainerUsage { name: name.into(), nanocores: m * 1_000_000, memory_bytes: 1 << 20 };
        let pods = vec![(pod("web-1", "n1"), vec![id("a"), id("b")]), (pod("web-2", "n2"), vec![id("a"), id("b")])];
        let usages = vec![vec![u("a", 100), u("b", 50)], vec![u("a", 10)]];
        let nodes = ["n1".to_string(), "n2".to_string()];
        let r = reports(&nodes, &pods, &usages, None, Duration::from_secs(5));
        assert_eq!(r.len(), 2);
        assert_eq!(r[0]["metadata"]["name"], "n1");
        assert_eq!(r[0]["usage"]["cpu"], "150000000n");
        assert_eq!(r[0]["pods"][0]["metadata"]["labels"]["app"], "web");
        assert_eq!(r[0]["pods"][0]["containers"][1]["usage"], json!({"cpu": "50000000n", "memory": "1024Ki"}));
        assert_eq!(r[0]["window"], "5.000s");
        assert_eq!(r[1]["pods"], json!([]), "web-2 has a container without a rate yet");
    }

    #[test]
    fn this_process_usage_is_read_from_proc() {
        let (cpu, rss) = process_usage(std::process::id());
        assert!(cpu.is_some() && rss.is_some_and(|r| r > 0));
        let (busy, memory) = node_usage();
        assert!(busy.is_some_and(|b| b > 0) && memory.is_some_and(|m| m > 0));
    }

    #[test]
    fn one_node_reports_alone_and_many_in_lists_of_at_most_a_hundred() {
        let report = |i: usize| json!({"kind": "NodeMetrics", "metadata": {"name": format!("n{i}")}});
        let one = batches(vec![report(0)]);
        assert_eq!(one, vec![report(0)], "a single node's report is sent as it is");
        let many = batches((0..250).map(report).collect());
        assert_eq!(many.len(), 3);
        assert!(many.iter().all(|b| b["kind"] == "NodeMetricsList"));
        let sizes: Vec<usize> = many.iter().map(|b| b["items"].as_array().map_or(0, Vec::len)).collect();
        assert_eq!(sizes, [100, 100, 50]);
        assert_eq!(many[2]["items"][49]["metadata"]["name"], "n249", "every report, in order");
        assert!(batches(Vec::new()).is_empty());
    }
}
