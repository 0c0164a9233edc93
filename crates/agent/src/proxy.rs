//! The Service data plane of a node (`--pod-network bridge`): ClusterIP and NodePort traffic
//! DNATed to ready endpoints by an nftables table of the agent's own (`ip shepherd`).
//!
//! The table has kube-proxy's nftables shape: a verdict map from ClusterIP . protocol . port to
//! one chain per Service port, which picks an endpoint (`numgen random mod N` vmap) and jumps to
//! one chain per endpoint that DNATs (and marks a pod reaching itself, for masquerade). A Service
//! port without a ready endpoint is in a second map whose verdict rejects at once (TCP reset or
//! ICMP port unreachable). So a change of one Service's endpoints rewrites that Service's chains
//! and map elements, nothing else.
//!
//! nft is driven by scripts on its stdin (`nft -f -`): a script is one kernel transaction, so a
//! rebuild is atomic, and its syntax is nft's own documented one. The Rust crates that speak
//! nftables (`rustables`, netlink; `nftables`, JSON for the same binary) would add a dependency
//! for what a few lines of text express, and netlink would mean writing expressions by hand.
//!
//! `sessionAffinity: ClientIP` is a timed set of clients per endpoint, filled as they pass and
//! checked before the random pick. A change of a Service's endpoints keeps the sets of those
//! that remain, and a rebuild gives every set that remains the clients the kernel had.
//!
//! Level-triggered: every `resync` the table's listing (less the affinity sets' clients) is
//! compared with what this proxy left there (the listing after the last full build, with the
//! chains and sets of the endpoint changes since listed again as they were applied); if someone
//! changed or removed anything, or Services came or went since, it is rebuilt from the Services
//! and Endpoints in one transaction.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use shepherd_api::{JsonPath, kinds};
use shepherd_runtime::Manager;

pub(crate) const TABLE: &str = "shepherd";
/// The packet mark that asks the postrouting chain to masquerade.
const MASQ_MARK: u32 = 0x4000;

/// One Service port as the kernel should see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServicePort {
    pub cluster_ip: Ipv4Addr,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    pub port: u16,
    pub node_port: Option<u16>,
    /// `sessionAffinity: ClientIP`: seconds a client sticks to the endpoint it first reached.
    pub affinity_seconds: Option<u32>,
    /// Ready endpoints (address, target port), sorted.
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

/// Every Service port of the cluster, by its chain name.
pub(crate) type Model = BTreeMap<String, ServicePort>;

fn protocol(p: Option<&str>) -> Option<&'static str> {
    match p.unwrap_or("TCP") {
        "TCP" => Some("tcp"),
        "UDP" => Some("udp"),
        "SCTP" => Some("sctp"),
        _ => None,
    }
}

/// The rules Services and their Endpoints (`endpoints("ns/name")`) call for. Services without a
/// ClusterIP (headless, ExternalName) have none.
pub(crate) fn desired(services: &[Arc<Value>], endpoints: impl Fn(&str) -> Option<Arc<Value>>) -> Model {
    let mut model = Model::new();
    for svc in services {
        let ns = svc.at("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
        let name = svc.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
        let Some(cluster_ip) = svc.at("/spec/clusterIP").and_then(Value::as_str).and_then(|ip| ip.parse::<Ipv4Addr>().ok()) else {
            continue;
        };
        let eps = endpoints(&format!("{ns}/{name}"));
        let affinity_seconds = (svc.at("/spec/sessionAffinity").and_then(Value::as_str) == Some("ClientIP")).then(|| {
            let t = svc.at("/spec/sessionAffinityConfig/clientIP/timeoutSeconds").and_then(Value::as_u64);
            t.and_then(|t| u32::try_from(t).ok()).filter(|t| *t > 0).unwrap_or(10_800)
        });
        for p in svc.at("/spec/ports").and_then(Value::as_array).into_iter().flatten() {
            let Some(proto) = protocol(p.at("/protocol").and_then(Value::as_str)) else { continue };
            let Some(port) = p.at("/port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0) else {
                continue;
            };
            let port_name = p.at("/name").and_then(Value::as_str).unwrap_or("");
            let node_port = p.at("/nodePort").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0);
            let mut ready = Vec::new();
            for subset in eps.iter().flat_map(|e| e.at("/subsets").and_then(Value::as_array)).flatten() {
                // The Endpoints controller names each subset port after the Service port.
                let target = subset.at("/ports").and_then(Value::as_array).into_iter().flatten().find(|sp| {
                    sp.at("/name").and_then(Value::as_str).unwrap_or("") == port_name
                        && protocol(sp.at("/protocol").and_then(Value::as_str)) == Some(proto)
                });
                let Some(target) = target.and_then(|t| t.at("/port")).and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok())
                else {
                    continue;
                };
                for a in subset.at("/addresses").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(ip) = a.at("/ip").and_then(Value::as_str).and_then(|ip| ip.parse::<Ipv4Addr>().ok()) {
                        ready.push((ip, target));
                    }
                }
            }
            ready.sort();
            ready.dedup();
            let chain = format!("svc-{ns}-{name}-{proto}-{port}");
            model.insert(chain, ServicePort { cluster_ip, protocol: proto, port, node_port, affinity_seconds, endpoints: ready });
        }
    }
    model
}

fn endpoint_chain(service_chain: &str, (ip, port): (Ipv4Addr, u16)) -> String {
    format!("ep-{}-{ip}-{port}", &service_chain[4..])
}

/// The clients that stick to an endpoint (`sessionAffinity: ClientIP`), timed out by the kernel.
fn affinity_set(endpoint_chain: &str) -> String {
    format!("affinity-{}", &endpoint_chain[3..])
}

/// The chains and rules of one Service port (not its map elements).
fn write_service(out: &mut String, chain: &str, sp: &ServicePort) {
    let t = TABLE;
    if sp.endpoints.is_empty() {
        return;
    }
    let mut picks = Vec::new();
    for (i, &ep) in sp.endpoints.iter().enumerate() {
        let epc = endpoint_chain(chain, ep);
        let _ = writeln!(out, "add chain ip {t} {epc}\nflush chain ip {t} {epc}");
        if let Some(secs) = sp.affinity_seconds {
            let set = affinity_set(&epc);
            let _ = writeln!(out, "add set ip {t} {set} {{ type ipv4_addr; flags dynamic,timeout; timeout {secs}s; }}");
            let _ = writeln!(out, "add rule ip {t} {epc} update @{set} {{ ip saddr }}");
        }
        // A pod reaching itself through its Service: its reply must come back through here.
        let _ = writeln!(out, "add rule ip {t} {epc} ip saddr {} meta mark set meta mark | {MASQ_MARK:#x}", ep.0);
        let _ = writeln!(out, "add rule ip {t} {epc} meta l4proto {} dnat to {}:{}", sp.protocol, ep.0, ep.1);
        picks.push(format!("{i} : goto {epc}"));
    }
    let _ = writeln!(out, "add chain ip {t} {chain}\nflush chain ip {t} {chain}");
    if sp.affinity_seconds.is_some() {
        for &ep in &sp.endpoints {
            let epc = endpoint_chain(chain, ep);
            let _ = writeln!(out, "add rule ip {t} {chain} ip saddr @{} goto {epc}", affinity_set(&epc));
        }
    }
    let _ = writeln!(out, "add rule ip {t} {chain} numgen random mod {} vmap {{ {} }}", sp.endpoints.len(), picks.join(", "));
    if sp.node_port.is_some() {
        let ext = format!("ext-{}", &chain[4..]);
        let _ = writeln!(out, "add chain ip {t} {ext}\nflush chain ip {t} {ext}");
        // Traffic from outside may go to an endpoint on another node: replies must return here.
        let _ = writeln!(out, "add rule ip {t} {ext} meta mark set meta mark | {MASQ_MARK:#x}");
        let _ = writeln!(out, "add rule ip {t} {ext} goto {chain}");
    }
}

/// The map elements of one Service port: where its traffic goes.
fn elements(chain: &str, sp: &ServicePort) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let key = format!("{} . {} . {}", sp.cluster_ip, sp.protocol, sp.port);
    let np = sp.node_port.map(|np| format!("{} . {np}", sp.protocol));
    if sp.endpoints.is_empty() {
        out.push(("no-endpoint-services", format!("{key} : goto reject-chain")));
        if let Some(np) = np {
            out.push(("no-endpoint-nodeports", format!("{np} : goto reject-chain")));
        }
    } else {
        out.push(("service-ips", format!("{key} : goto {chain}")));
        if let Some(np) = np {
            out.push(("service-nodeports", format!("{np} : goto ext-{}", &chain[4..])));
        }
    }
    out
}

fn add_elements(out: &mut String, chain: &str, sp: &ServicePort) {
    for (map, e) in elements(chain, sp) {
        let _ = writeln!(out, "add element ip {TABLE} {map} {{ {e} }}");
    }
}

/// Removes what `write_service` and `add_elements` made for `sp`.
fn remove_service(out: &mut String, chain: &str, sp: &ServicePort) {
    let t = TABLE;
    for (map, e) in elements(chain, sp) {
        let key = e.split(" : ").next().unwrap_or("");
        let _ = writeln!(out, "delete element ip {t} {map} {{ {key} }}");
    }
    if sp.endpoints.is_empty() {
        return;
    }
    if sp.node_port.is_some() {
        let _ = writeln!(out, "delete chain ip {t} ext-{}", &chain[4..]);
    }
    let _ = writeln!(out, "delete chain ip {t} {chain}");
    for &ep in &sp.endpoints {
        let epc = endpoint_chain(chain, ep);
        let _ = writeln!(out, "delete chain ip {t} {epc}");
        if sp.affinity_seconds.is_some() {
            let _ = writeln!(out, "delete set ip {t} {}", affinity_set(&epc));
        }
    }
}

/// One transaction that replaces the whole table with `model`'s, giving the affinity sets that
/// remain the `clients` they had, so a rebuild does not move clients of `sessionAffinity`.
pub(crate) fn full_script(model: &Model, clients: &Clients) -> String {
    let t = TABLE;
    let mut out = String::new();
    let _ = writeln!(out, "add table ip {t}\ndelete table ip {t}\nadd table ip {t}");
    let key = "ipv4_addr . inet_proto . inet_service";
    for map in ["service-ips", "no-endpoint-services"] {
        let _ = writeln!(out, "add map ip {t} {map} {{ type {key} : verdict; }}");
    }
    for map in ["service-nodeports", "no-endpoint-nodeports"] {
        let _ = writeln!(out, "add map ip {t} {map} {{ type inet_proto . inet_service : verdict; }}");
    }
    let _ = writeln!(out, "add chain ip {t} reject-chain");
    let _ = writeln!(out, "add rule ip {t} reject-chain meta l4proto tcp reject with tcp reset");
    let _ = writeln!(out, "add rule ip {t} reject-chain reject");
    // Refusals come before DNAT (priority dstnat - 10), for pods (prerouting) and the node (output).
    for (chain, hook) in [("filter-prerouting", "prerouting"), ("filter-output", "output")] {
        let _ = writeln!(out, "add chain ip {t} {chain} {{ type filter hook {hook} priority -110; policy accept; }}");
        let _ = writeln!(out, "add rule ip {t} {chain} ct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services");
        let _ = writeln!(
            out,
            "add rule ip {t} {chain} ct state new fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports"
        );
    }
    let _ = writeln!(out, "add chain ip {t} services");
    let _ = writeln!(out, "add rule ip {t} services ip daddr . meta l4proto . th dport vmap @service-ips");
    let _ = writeln!(out, "add rule ip {t} services fib daddr type local meta l4proto . th dport vmap @service-nodeports");
    for (chain, hook) in [("nat-prerouting", "prerouting"), ("nat-output", "output")] {
        let _ = writeln!(out, "add chain ip {t} {chain} {{ type nat hook {hook} priority -100; policy accept; }}");
        let _ = writeln!(out, "add rule ip {t} {chain} jump services");
    }
    let _ = writeln!(out, "add chain ip {t} nat-postrouting {{ type nat hook postrouting priority 100; policy accept; }}");
    let _ = writeln!(out, "add rule ip {t} nat-postrouting meta mark & {MASQ_MARK:#x} != 0 masquerade");
    for (chain, sp) in model {
        write_service(&mut out, chain, sp);
        add_elements(&mut out, chain, sp);
        if sp.affinity_seconds.is_none() {
            continue;
        }
        for &ep in &sp.endpoints {
            let set = affinity_set(&endpoint_chain(chain, ep));
            if let Some(kept) = clients.get(&set).filter(|c| !c.is_empty()) {
                let _ = writeln!(out, "add element ip {t} {set} {{ {} }}", kept.join(", "));
            }
        }
    }
    out
}

/// The transaction that turns `old` into `new`, touching only the Service ports that differ;
/// `None` when nothing does.
pub(crate) fn diff_script(old: &Model, new: &Model) -> Option<String> {
    let mut out = String::new();
    for (chain, sp) in old {
        match new.get(chain) {
            Some(n) if n == sp || only_endpoints_differ(sp, n) => {}
            _ => remove_service(&mut out, chain, sp),
        }
    }
    for (chain, sp) in new {
        match old.get(chain) {
            Some(o) if o == sp => {}
            // The map elements stay; the endpoints that remain keep their chains and the
            // clients in their affinity sets.
            Some(o) if only_endpoints_differ(o, sp) => {
                write_service(&mut out, chain, sp);
                for &ep in o.endpoints.iter().filter(|ep| !sp.endpoints.contains(ep)) {
                    let epc = endpoint_chain(chain, ep);
                    let _ = writeln!(out, "delete chain ip {TABLE} {epc}");
                    if o.affinity_seconds.is_some() {
                        let _ = writeln!(out, "delete set ip {TABLE} {}", affinity_set(&epc));
                    }
                }
            }
            _ => {
                write_service(&mut out, chain, sp);
                add_elements(&mut out, chain, sp);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `new` is `old` with other ready endpoints, some in both: its map elements are the same.
fn only_endpoints_differ(old: &ServicePort, new: &ServicePort) -> bool {
    let same = |sp: &ServicePort| (sp.cluster_ip, sp.protocol, sp.port, sp.node_port, sp.affinity_seconds);
    same(old) == same(new) && !old.endpoints.is_empty() && !new.endpoints.is_empty()
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NftError {
    #[error("running nft (package nftables): {0}")]
    Spawn(std::io::Error),
    #[error("nft refused the rules: {0}")]
    Refused(String),
}

/// Feeds `script` to `nft -f -` as one transaction.
pub(crate) fn apply(script: &str) -> Result<(), NftError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(NftError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NftError::Refused(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }
}

/// The clients of the affinity sets, by set: each as nft lists it (`10.244.1.7 timeout 3h
/// expires 2h59m`), which nft takes back as an element with the time it has left.
type Clients = BTreeMap<String, Vec<String>>;

/// The kernel's copy of the table.
struct Listing {
    /// The listing without the affinity sets' clients, which traffic changes.
    rules: String,
    clients: Clients,
}

/// The kernel's listing of the table, `None` when it is missing.
fn listing() -> Option<Listing> {
    let out = Command::new("nft").args(["list", "table", "ip", TABLE]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(parse_listing(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_listing(text: &str) -> Listing {
    let (mut rules, mut clients) = (String::new(), Clients::new());
    let (mut set, mut elements): (Option<String>, Option<String>) = (None, None);
    for line in text.lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("set affinity-").and_then(|n| n.strip_suffix(" {")) {
            set = Some(format!("affinity-{name}"));
        } else if set.is_some() && elements.is_none() && l.starts_with("elements = {") {
            elements = Some(String::new());
        }
        if let Some(e) = elements.as_mut() {
            e.push_str(l);
            e.push(' ');
            if l.ends_with('}') {
                let inner = e.trim().trim_start_matches("elements = {").trim_end_matches('}');
                let listed = inner.split(',').map(str::trim).filter(|c| !c.is_empty()).map(str::to_string);
                clients.entry(set.clone().unwrap_or_default()).or_default().extend(listed);
                elements = None;
            }
            continue;
        }
        if set.is_some() && l == "}" {
            set = None;
        }
        rules.push_str(line);
        rules.push('\n');
    }
    Listing { rules, clients }
}

/// A listing's chains, sets and maps by their header (`chain services`), each with its lines.
type Blocks = BTreeMap<String, String>;

fn blocks(rules: &str) -> Blocks {
    let mut out = Blocks::new();
    let mut open: Option<(String, String)> = None;
    for line in rules.lines() {
        match &mut open {
            Some((_, body)) if line != "\t}" => {
                body.push_str(line);
                body.push('\n');
            }
            Some(_) => {
                if let Some((header, body)) = open.take() {
                    out.insert(header, body);
                }
            }
            None => {
                if let Some(header) = line.strip_prefix('\t').filter(|l| !l.starts_with('\t')).and_then(|l| l.strip_suffix(" {")) {
                    open = Some((header.to_string(), String::new()));
                }
            }
        }
    }
    out
}

/// The chains and sets a change script wrote and deleted (`chain NAME`, `set NAME`), or `None`
/// when it also changed map elements.
fn touched(script: &str) -> Option<(Vec<String>, Vec<String>)> {
    let (mut written, mut deleted) = (Vec::new(), Vec::new());
    for line in script.lines() {
        let words: Vec<&str> = line.split_whitespace().take(5).collect();
        match words.as_slice() {
            [_, "element", ..] => return None,
            ["add", kind @ ("chain" | "set"), "ip", TABLE, name] => written.push(format!("{kind} {name}")),
            ["delete", kind @ ("chain" | "set"), "ip", TABLE, name] => deleted.push(format!("{kind} {name}")),
            _ => {}
        }
    }
    written.retain(|w| !deleted.contains(w));
    written.dedup();
    Some((written, deleted))
}

/// What is in the kernel, as far as this proxy knows.
struct Applied {
    model: Model,
    /// The kernel's listing as this proxy left it: taken after the last full build or check,
    /// less the chains and sets that endpoint changes deleted since. `None` when unknown (after
    /// a change of map elements, which the next resync settles by a rebuild).
    reference: Option<Blocks>,
    /// The Service ports whose endpoints changed since the last check: their chains are
    /// written again at the check, so that what the listing then shows of them is this
    /// proxy's own.
    rewritten: std::collections::BTreeSet<String>,
}

impl Applied {
    fn new() -> Applied {
        Applied { model: Model::new(), reference: None, rewritten: Default::default() }
    }

    /// Replaces the table with `model`'s, keeping the clients of affinity sets that the
    /// kernel's copy (`found`, else listed now) has.
    fn rebuild(&mut self, model: Model, found: Option<Listing>) -> Result<(), NftError> {
        let clients = found.or_else(listing).map(|l| l.clients).unwrap_or_default();
        apply(&full_script(&model, &clients))?;
        self.reference = listing().map(|l| blocks(&l.rules));
        self.rewritten.clear();
        self.model = model;
        Ok(())
    }

    /// Applies what changed; a refused change (the kernel is not what was applied) rebuilds.
    fn update(&mut self, model: Model) -> Result<bool, NftError> {
        let Some(script) = diff_script(&self.model, &model) else { return Ok(false) };
        if let Err(e) = apply(&script) {
            tracing::info!(error = %e, "nftables table differs from what was applied; rebuilding it");
            self.rebuild(model, None)?;
            return Ok(true);
        }
        match (self.reference.as_mut(), touched(&script)) {
            (Some(reference), Some((_, deleted))) => {
                for d in &deleted {
                    reference.remove(d);
                }
                let changed = model.iter().filter(|(k, sp)| self.model.get(*k).is_some_and(|o| o != *sp));
                self.rewritten.extend(changed.map(|(k, _)| k.clone()));
            }
            _ => {
                self.reference = None;
                self.rewritten.clear();
            }
        }
        self.model = model;
        Ok(true)
    }

    /// Rebuilds the table unless the kernel holds what this proxy left there. The chains of
    /// endpoint changes since the last check are written again first (each is flushed and
    /// filled, so whatever someone did to them is undone) and taken from the listing; the rest
    /// must equal the last listing. A change of map elements may land on a table someone else
    /// damaged (an element deleted by hand), so after one the check rebuilds rather than trust
    /// the kernel's listing. A rebuild keeps the clients of affinity sets. True when it rebuilt.
    fn resync(&mut self, model: Model) -> Result<bool, NftError> {
        if model != self.model || self.reference.is_none() {
            return self.rebuild(model, None).map(|()| true);
        }
        let mut again = String::new();
        for chain in &self.rewritten {
            if let Some(sp) = self.model.get(chain) {
                write_service(&mut again, chain, sp);
            }
        }
        let written = touched(&again).map(|(w, _)| w).unwrap_or_default();
        if !again.is_empty() && apply(&again).is_err() {
            return self.rebuild(model, None).map(|()| true);
        }
        let found = listing();
        let have = found.as_ref().map(|l| blocks(&l.rules));
        let same = match (&self.reference, &have) {
            (Some(want), Some(have)) => {
                let differs = |k: &String| !written.contains(k) && want.get(k) != have.get(k);
                !want.keys().chain(have.keys()).any(differs)
            }
            _ => false,
        };
        if same {
            self.reference = have;
            self.rewritten.clear();
            return Ok(false);
        }
        tracing::info!("nftables table {TABLE} was changed by someone else; rebuilding it");
        self.rebuild(model, found).map(|()| true)
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `t` is.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// CPU time used by this process's children that were waited for: the `nft` runs. (Other
/// children reaped meanwhile count too; the figure is for logs and benchmarks.)
fn children_cpu() -> Duration {
    // SAFETY: rusage is plain data, for which all zeroes is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage, which `u` is.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let tv = |t: libc::timeval| Duration::from_micros(u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0));
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Keeps the table in step with Services and Endpoints: a change is applied as soon as an
/// informer sees it; every `resync` the whole table is checked and rebuilt if it differs.
pub(crate) fn run(manager: &Manager, resync: Duration) -> impl Future<Output = ()> + use<> {
    let services = manager.informers().informer(&kinds::SERVICE);
    let endpoints = manager.informers().informer(&kinds::ENDPOINTS);
    let changed = Arc::new(tokio::sync::Notify::new());
    // When the oldest change not yet applied arrived, for the event-to-rule latency.
    let since: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    for informer in [&services, &endpoints] {
        let (notify, since) = (changed.clone(), since.clone());
        informer.subscribe(move |_| {
            since.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(Instant::now);
            notify.notify_one();
        });
    }
    async move {
        services.wait_synced().await;
        endpoints.wait_synced().await;
        let (svc_cache, ep_cache) = (services.cache().clone(), endpoints.cache().clone());
        let mut applied = Some(Applied::new());
        let mut next_resync = Instant::now();
        loop {
            let started = since.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_else(Instant::now);
            let (cpu_before, began) = (thread_cpu(), Instant::now());
            let model = desired(&svc_cache.list(), |key| ep_cache.get(key));
            let desired_cpu = thread_cpu().saturating_sub(cpu_before);
            let resync_now = Instant::now() >= next_resync;
            let Some(mut state) = applied.take() else { return };
            // nft runs off the async workers.
            let joined = tokio::task::spawn_blocking(move || {
                let (own, children) = (thread_cpu(), children_cpu());
                let r = if resync_now { state.resync(model) } else { state.update(model) };
                let cpu = thread_cpu().saturating_sub(own) + children_cpu().saturating_sub(children);
                (state, r, cpu)
            })
            .await;
            let Ok((state, result, apply_cpu)) = joined else { return };
            // CPU of this process and of nft, to compute the model and apply it.
            let cpu_ms = (desired_cpu + apply_cpu).as_secs_f64() * 1e3;
            let took_ms = began.elapsed().as_secs_f64() * 1e3;
            match result {
                Ok(true) if resync_now => tracing::info!(took_ms, cpu_ms, "service table rebuilt"),
                Ok(true) => {
                    tracing::info!(event_to_rule_ms = started.elapsed().as_secs_f64() * 1e3, cpu_ms, "service rules applied")
                }
                Ok(false) if resync_now => tracing::debug!(took_ms, cpu_ms, "service table checked"),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "cannot apply the service rules"),
            }
            applied = Some(state);
            if resync_now {
                next_resync = Instant::now() + resync;
            }
            let _ = tokio::time::timeout_at(next_resync.into(), changed.notified()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;

    fn service(name: &str, ip: &str, node_port: Option<u16>) -> Arc<Value> {
        let mut port = json!({"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080});
        if let Some(np) = node_port {
            port["nodePort"] = json!(np);
        }
        Arc::new(json!({"metadata": {"namespace": "default", "name": name}, "spec": {"clusterIP": ip, "ports": [port]}}))
    }

    fn endpoints(ready: &[&str], not_ready: &[&str]) -> Arc<Value> {
        let addrs = |ips: &[&str]| ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>();
        Arc::new(json!({"subsets": [{"addresses": addrs(ready), "notReadyAddresses": addrs(not_ready),
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]}))
    }

    fn model(services: &[Arc<Value>], eps: &[(&str, Arc<Value>)]) -> Model {
        let eps: HashMap<String, Arc<Value>> = eps.iter().map(|(k, v)| (format!("default/{k}"), v.clone())).collect();
        desired(services, |key| eps.get(key).cloned())
    }

    #[test]
    fn only_ready_addresses_become_endpoints_and_headless_services_get_no_rules() {
        let m = model(
            &[service("web", "10.96.0.10", None), service("headless", "None", None)],
            &[("web", endpoints(&["10.244.0.3", "10.244.0.2"], &["10.244.0.9"]))],
        );
        assert_eq!(m.len(), 1, "{m:?}");
        let web = &m["svc-default-web-tcp-80"];
        assert_eq!(web.endpoints, vec![("10.244.0.2".parse().unwrap(), 8080), ("10.244.0.3".parse().unwrap(), 8080)]);
    }

    #[test]
    fn a_change_of_one_services_endpoints_touches_only_that_services_chains_and_elements() {
        let services = [service("web", "10.96.0.10", None), service("api", "10.96.0.11", Some(30080))];
        let before = model(&services, &[("web", endpoints(&["10.244.0.2"], &[])), ("api", endpoints(&["10.244.1.2"], &[]))]);
        let after = model(&services, &[("web", endpoints(&["10.244.0.3"], &[])), ("api", endpoints(&["10.244.1.2"], &[]))]);
        let script = diff_script(&before, &after).expect("a change");
        assert!(!script.contains("api") && !script.contains("10.96.0.11"), "{script}");
        assert!(script.contains("delete chain ip shepherd ep-default-web-tcp-80-10.244.0.2-8080"), "{script}");
        assert!(script.contains("dnat to 10.244.0.3:8080"), "{script}");
        assert_eq!(diff_script(&after, &after), None, "no change, no script");
    }

    /// Runs `f` on a thread in a network namespace of its own, so nft changes nothing else.
    fn in_private_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            // SAFETY: unshare changes only this thread's network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare needs root: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread")
    }

    #[test]
    fn the_kernel_takes_the_full_table_and_a_change_then_a_service_without_endpoints_rejects() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (a network namespace of its own for nft)");
        }
        let services = [service("web", "10.96.0.10", Some(30080))];
        let before = model(&services, &[("web", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let after = model(&services, &[("web", endpoints(&[], &["10.244.0.2"]))]);
        let listed = in_private_netns(move || {
            apply(&full_script(&before, &Clients::new())).expect("full table");
            apply(&diff_script(&before, &after).expect("a change")).expect("the change");
            listing().expect("the table").rules
        });
        assert!(listed.contains("10.96.0.10 . tcp . 80 : goto reject-chain"), "{listed}");
        assert!(listed.contains("tcp . 30080 : goto reject-chain"), "{listed}");
        assert!(!listed.contains("ep-default-web"), "endpoint chains are gone:\n{listed}");
    }

    #[test]
    fn a_listing_gives_the_affinity_sets_clients_apart_from_the_rules() {
        let text = "table ip shepherd {\n\tset affinity-default-s-tcp-80-10.244.0.2-8080 {\n\t\ttype ipv4_addr\n\
            \t\tflags dynamic,timeout\n\t\ttimeout 1m\n\t\telements = { 10.244.1.7 timeout 1m expires 59s876ms,\n\
            \t\t\t     10.244.1.8 timeout 1m expires 2s }\n\t}\n\n\tchain services {\n\t}\n}\n";
        let l = parse_listing(text);
        assert_eq!(
            l.clients["affinity-default-s-tcp-80-10.244.0.2-8080"],
            ["10.244.1.7 timeout 1m expires 59s876ms", "10.244.1.8 timeout 1m expires 2s"]
        );
        assert!(!l.rules.contains("10.244.1.7") && l.rules.contains("timeout 1m") && l.rules.contains("chain services"), "{}", l.rules);
    }

    #[test]
    fn a_change_of_endpoints_keeps_the_chains_and_clients_of_the_endpoints_that_remain() {
        let mut sticky = (*service("web", "10.96.0.10", None)).clone();
        sticky["spec"]["sessionAffinity"] = json!("ClientIP");
        let sticky = [Arc::new(sticky)];
        let before = model(&sticky, &[("web", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let after = model(&sticky, &[("web", endpoints(&["10.244.0.2", "10.244.0.4"], &[]))]);
        let script = diff_script(&before, &after).expect("a change");
        assert!(script.contains("delete set ip shepherd affinity-default-web-tcp-80-10.244.0.3-8080"), "{script}");
        assert!(!script.contains("delete set ip shepherd affinity-default-web-tcp-80-10.244.0.2-8080"), "{script}");
        assert!(!script.contains("delete element"), "the map elements stay: {script}");
    }

    #[test]
    fn clients_stick_across_a_rebuild_for_an_unrelated_service_and_a_change_of_their_services_other_endpoints() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (a network namespace of its own for nft)");
        }
        let mut sticky = (*service("sticky", "10.96.0.12", None)).clone();
        sticky["spec"]["sessionAffinity"] = json!("ClientIP");
        let sticky = Arc::new(sticky);
        let two = model(std::slice::from_ref(&sticky), &[("sticky", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let with_other = model(
            &[sticky.clone(), service("other", "10.96.0.13", None)],
            &[("sticky", endpoints(&["10.244.0.2", "10.244.0.3"], &[])), ("other", endpoints(&["10.244.0.9"], &[]))],
        );
        let moved = model(
            &[sticky, service("other", "10.96.0.13", None)],
            &[("sticky", endpoints(&["10.244.0.2", "10.244.0.4"], &[])), ("other", endpoints(&["10.244.0.9"], &[]))],
        );
        let clients = in_private_netns(move || {
            let mut applied = Applied::new();
            applied.rebuild(two, None).expect("full table");
            let add = format!("add element ip {TABLE} affinity-default-sticky-tcp-80-10.244.0.2-8080 {{ 10.244.1.7 }}");
            apply(&add).expect("a client");
            applied.update(with_other.clone()).expect("an unrelated Service");
            assert!(applied.resync(with_other).expect("a resync"), "the resync after a change rebuilds");
            applied.update(moved).expect("the other endpoint replaced");
            listing().expect("the table").clients
        });
        let kept = clients.get("affinity-default-sticky-tcp-80-10.244.0.2-8080").cloned().unwrap_or_default();
        assert!(kept.len() == 1 && kept[0].starts_with("10.244.1.7 ") && kept[0].contains("expires"), "{clients:?}");
    }

    #[test]
    fn an_endpoint_change_needs_no_rebuild_but_damage_anywhere_after_it_is_repaired() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (a network namespace of its own for nft)");
        }
        let services = [service("web", "10.96.0.10", Some(30080)), service("api", "10.96.0.11", None)];
        let before = model(&services, &[("web", endpoints(&["10.244.0.2", "10.244.0.3"], &[])), ("api", endpoints(&["10.244.1.2"], &[]))]);
        let after = model(&services, &[("web", endpoints(&["10.244.0.2", "10.244.0.4"], &[])), ("api", endpoints(&["10.244.1.2"], &[]))]);
        let rebuilt = in_private_netns(move || {
            let mut applied = Applied::new();
            applied.rebuild(before, None).expect("full table");
            let mut rebuilt = Vec::new();
            applied.update(after.clone()).expect("an endpoint change");
            rebuilt.push(applied.resync(after.clone()).expect("a resync"));
            // Someone empties the chain the change just wrote, then one it left alone.
            for chain in ["svc-default-web-tcp-80", "svc-default-api-tcp-80"] {
                apply(&format!("flush chain ip {TABLE} {chain}")).expect("flush");
                rebuilt.push(applied.resync(after.clone()).expect("a resync"));
                rebuilt.push(applied.resync(after.clone()).expect("a resync"));
            }
            rebuilt
        });
        assert_eq!(rebuilt, [false, true, false, true, false], "rebuilt only when someone else changed the table");
    }

    #[test]
    fn clients_of_a_service_with_affinity_are_remembered_per_endpoint_and_left_out_of_the_listing() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (a network namespace of its own for nft)");
        }
        let mut sticky = (*service("sticky", "10.96.0.12", None)).clone();
        sticky["spec"]["sessionAffinity"] = json!("ClientIP");
        sticky["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 60}});
        let m = model(&[Arc::new(sticky)], &[("sticky", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let (listed, without_clients) = in_private_netns(move || {
            apply(&full_script(&m, &Clients::new())).expect("full table");
            let before = listing().map(|l| l.rules);
            let add = format!("add element ip {TABLE} affinity-default-sticky-tcp-80-10.244.0.2-8080 {{ 10.244.1.7 }}");
            apply(&add).expect("a client");
            let out = Command::new("nft").args(["list", "table", "ip", TABLE]).output().expect("nft list");
            (String::from_utf8_lossy(&out.stdout).into_owned(), before == listing().map(|l| l.rules))
        });
        assert!(listed.contains("ip saddr @affinity-default-sticky-tcp-80-10.244.0.2-8080 goto ep-default-sticky"), "{listed}");
        assert!(listed.contains("timeout 1m") && listed.contains("10.244.1.7 expires"), "{listed}");
        assert!(without_clients, "a remembered client does not make the table differ");
    }
}
