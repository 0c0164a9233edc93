//! The Service data plane of a node (`--pod-network bridge`): ClusterIP and NodePort traffic
//! DNATed to ready endpoints by an nftables table of the agent's own (`ip shepherd`).
//!
//! The table follows kube-proxy's nftables mode where that stays cheap for the kernel: verdict
//! maps from ClusterIP . protocol . port, and from protocol . NodePort, to one chain per Service
//! port; a Service port without a ready endpoint is in a second map whose verdict rejects at once
//! (TCP reset or ICMP port unreachable). The Service port's chain has one rule, `dnat to numgen
//! random mod N map @eps-...`: its endpoints are the elements of a data map of its own (endpoint
//! number to address . port), not chains. That is for the kernel's sake: a transaction that
//! adds a rule with a NAT or a jump, or a verdict-map element, makes the commit validate every
//! chain the table's hooks reach, which with a chain per endpoint was most of a change's CPU at
//! 1,000 Services; elements of a data map make it validate nothing. So a change of endpoints
//! writes the map's elements only, and the rule too if the number of endpoints changed (whose
//! validation then walks one chain per Service port). A pod that reaches itself through its
//! Service is masqueraded by one postrouting rule, from a set of `endpoint . endpoint` address
//! pairs, so that its replies come back through the node.
//!
//! `sessionAffinity: ClientIP` keeps kube-proxy's shape for the Services that ask for it: one
//! chain per endpoint that DNATs and adds the client to a timed set of the endpoint's, checked
//! before the random pick (`numgen random mod N vmap`). A change of such a Service's endpoints
//! keeps the sets of those that remain, and a rebuild gives every set that remains the clients
//! the kernel had.
//!
//! A change of Services is written to the kernel as netlink messages (`netlink`): one
//! transaction that names what it changes, so that its cost does not grow with the table, as
//! `nft`'s does (it loads the table first). A rebuild and the check that lists the table use
//! `nft` (`nft -f -` scripts, one transaction each, in nft's documented syntax), whose cost
//! matters little there: they are rare, and the listing is read as nft prints it.
//!
//! The model is kept per Service: an informer event recomputes and applies that Service's ports
//! only. Level-triggered: every `resync` the kernel's ruleset generation (one netlink message) is
//! compared with the one after this proxy's last transaction; only when someone else committed
//! since (or after a rebuild) is the table listed, on a thread of its own while changes go on,
//! and compared with what this proxy left there (the listing before, less the chains the changes
//! since deleted; the chains they wrote are written again before listing and taken as listed;
//! the maps' elements against the model). A listing during which a change was committed tells
//! nothing and is taken again. If the table differs, it is rebuilt from the Services and
//! Endpoints in one transaction.

mod generation;
mod netlink;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use shepherd_api::{JsonPath, kinds};
use shepherd_runtime::Manager;

use netlink::{Batch, Expr, NetlinkError};

pub(crate) const TABLE: &str = "shepherd";
/// The verdict maps: by ClusterIP . protocol . port, then by protocol . NodePort.
const MAPS: [&str; 4] = ["service-ips", "no-endpoint-services", "service-nodeports", "no-endpoint-nodeports"];
/// How many emptied chains and sets of endpoints gone wait, at most, for one transaction that
/// deletes them all (else the next check that lists the table does).
const RETIRED_BATCH: usize = 64;
/// How often the whole model is recomputed from the informers' caches, which mends one missed
/// event. The table is not listed for it: every transaction, anyone's, moves the ruleset
/// generation, so an unchanged generation since this proxy's own last commit proves the table
/// holds what it committed, which a listing (seconds at 1,000 Services) would only confirm.
const FULL_CHECK: Duration = Duration::from_secs(60);
/// The packet mark that asks the postrouting chain to masquerade.
const MASQ_MARK: u32 = 0x4000;
/// The set of `endpoint . endpoint` address pairs: a connection DNATed from an endpoint to
/// itself (a pod reaching itself through its Service) is masqueraded, so its replies come back
/// through the node to be un-DNATed.
const HAIRPIN: &str = "hairpin";
/// The type of a Service port's endpoint map: endpoint number (what `numgen random mod N`
/// picks) to address and port. The modulus in it is only what nft prints; the rule carries the
/// real one.
fn endpoint_map_type(protocol: &str) -> String {
    format!("typeof numgen random mod 1 : ip daddr . {protocol} dport")
}

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

/// Service ports by their chain name: one Service's, or every one's.
pub(crate) type Model = BTreeMap<String, ServicePort>;

/// The ports of every Service, by the Service's `namespace/name`.
pub(crate) type Services = BTreeMap<String, Model>;

fn protocol(p: Option<&str>) -> Option<&'static str> {
    match p.unwrap_or("TCP") {
        "TCP" => Some("tcp"),
        "UDP" => Some("udp"),
        "SCTP" => Some("sctp"),
        _ => None,
    }
}

/// A Service's (or its Endpoints') `namespace/name`, the key of both in the informers' caches.
fn key_of(obj: &Value) -> String {
    let ns = obj.at("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let name = obj.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
    format!("{ns}/{name}")
}

/// The rules Services and their Endpoints (`endpoints("ns/name")`) call for.
pub(crate) fn desired(services: &[Arc<Value>], endpoints: impl Fn(&str) -> Option<Arc<Value>>) -> Services {
    let mut all = Services::new();
    for svc in services {
        let key = key_of(svc);
        let ports = service_ports(svc, endpoints(&key).as_deref());
        if !ports.is_empty() {
            all.insert(key, ports);
        }
    }
    all
}

/// The ports of one Service and its Endpoints. Services without a ClusterIP (headless,
/// ExternalName) have none.
pub(crate) fn service_ports(svc: &Value, eps: Option<&Value>) -> Model {
    let mut model = Model::new();
    let ns = svc.at("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
    let name = svc.at("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let Some(cluster_ip) = svc.at("/spec/clusterIP").and_then(Value::as_str).and_then(|ip| ip.parse::<Ipv4Addr>().ok()) else {
        return model;
    };
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
    model
}

/// The endpoint map of a Service port without affinity.
fn endpoint_map(service_chain: &str) -> String {
    format!("eps-{}", &service_chain[4..])
}

/// The elements of a Service port's endpoint map, as nft lists them (`0 : 10.244.0.2 . 8080`).
fn endpoint_elements(sp: &ServicePort) -> Vec<String> {
    sp.endpoints.iter().enumerate().map(|(i, (ip, port))| format!("{i} : {ip} . {port}")).collect()
}

/// The rule of a Service port without affinity: DNAT to a random entry of its endpoint map.
fn endpoint_pick(chain: &str, sp: &ServicePort) -> String {
    format!("meta l4proto {} dnat to numgen random mod {} map @{}", sp.protocol, sp.endpoints.len(), endpoint_map(chain))
}

fn endpoint_chain(service_chain: &str, (ip, port): (Ipv4Addr, u16)) -> String {
    format!("ep-{}-{ip}-{port}", &service_chain[4..])
}

/// The clients that stick to an endpoint (`sessionAffinity: ClientIP`), timed out by the kernel.
fn affinity_set(endpoint_chain: &str) -> String {
    format!("affinity-{}", &endpoint_chain[3..])
}

/// Writes chain `name` of the table afresh with `rules`. The rules go in the chain's own block
/// (`add chain ... { rule; ... }`) rather than as `add rule` commands: for those nft first
/// loads every chain of the table, a cost that grows with the number of Services, while for a
/// chain it loads the table alone.
fn write_chain(out: &mut String, name: &str, rules: &[String]) {
    let t = TABLE;
    let _ = writeln!(out, "add chain ip {t} {name}\nflush chain ip {t} {name}\nadd chain ip {t} {name} {{ {}; }}", rules.join("; "));
}

/// The chains, rules and endpoint map of one Service port (not its elements of the shared maps).
fn write_service(out: &mut String, chain: &str, sp: &ServicePort) {
    let t = TABLE;
    if sp.endpoints.is_empty() {
        return;
    }
    if sp.affinity_seconds.is_none() {
        let (map, kind) = (endpoint_map(chain), endpoint_map_type(sp.protocol));
        let _ = writeln!(out, "add map ip {t} {map} {{ {kind}; }}\nflush map ip {t} {map}");
        let elements = endpoint_elements(sp).join(", ");
        let _ = writeln!(out, "add map ip {t} {map} {{ {kind}; elements = {{ {elements} }}; }}");
        write_chain(out, chain, &[endpoint_pick(chain, sp)]);
    } else {
        let mut picks = Vec::new();
        for (i, &ep) in sp.endpoints.iter().enumerate() {
            let epc = endpoint_chain(chain, ep);
            let set = affinity_set(&epc);
            let secs = sp.affinity_seconds.unwrap_or_default();
            let _ = writeln!(out, "add set ip {t} {set} {{ type ipv4_addr; flags dynamic,timeout; timeout {secs}s; }}");
            let rules = [format!("update @{set} {{ ip saddr }}"), format!("meta l4proto {} dnat to {}:{}", sp.protocol, ep.0, ep.1)];
            write_chain(out, &epc, &rules);
            picks.push(format!("{i} : goto {epc}"));
        }
        let mut rules = Vec::new();
        for &ep in &sp.endpoints {
            let epc = endpoint_chain(chain, ep);
            rules.push(format!("ip saddr @{} goto {epc}", affinity_set(&epc)));
        }
        rules.push(format!("numgen random mod {} vmap {{ {} }}", sp.endpoints.len(), picks.join(", ")));
        write_chain(out, chain, &rules);
    }
    if sp.node_port.is_some() {
        // Traffic from outside may go to an endpoint on another node: replies must return here.
        let rules = [format!("meta mark set meta mark | {MASQ_MARK:#x}"), format!("goto {chain}")];
        write_chain(out, &format!("ext-{}", &chain[4..]), &rules);
    }
}

/// The endpoint chains (`chain NAME`) and affinity sets (`set NAME`) that `old` has and `new`,
/// the same Service port with other endpoints, no longer uses.
fn retired(chain: &str, old: &ServicePort, new: &ServicePort) -> Vec<String> {
    let mut out = Vec::new();
    if old.affinity_seconds.is_none() {
        return out;
    }
    for &ep in old.endpoints.iter().filter(|ep| !new.endpoints.contains(ep)) {
        let epc = endpoint_chain(chain, ep);
        if old.affinity_seconds.is_some() {
            out.push(format!("set {}", affinity_set(&epc)));
        }
        out.push(format!("chain {epc}"));
    }
    out
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

/// The type of verdict map `map`.
fn map_type(map: &str) -> &'static str {
    if MAPS[..2].contains(&map) { "ipv4_addr . inet_proto . inet_service : verdict" } else { "inet_proto . inet_service : verdict" }
}

/// Adds the map elements of `sp`, in the maps' own blocks: for `add element` nft first loads
/// every chain of the table, for `add map` the table alone.
fn add_elements(out: &mut String, chain: &str, sp: &ServicePort) {
    for (map, e) in elements(chain, sp) {
        let _ = writeln!(out, "add map ip {TABLE} {map} {{ type {}; elements = {{ {e} }}; }}", map_type(map));
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
    if sp.affinity_seconds.is_none() {
        let _ = writeln!(out, "delete map ip {t} {}", endpoint_map(chain));
        return;
    }
    for &ep in &sp.endpoints {
        let epc = endpoint_chain(chain, ep);
        let _ = writeln!(out, "delete chain ip {t} {epc}");
        let _ = writeln!(out, "delete set ip {t} {}", affinity_set(&epc));
    }
}

/// One transaction that replaces the whole table with `services`', giving the affinity sets that
/// remain the `clients` they had, so a rebuild does not move clients of `sessionAffinity`.
pub(crate) fn full_script(services: &Services, clients: &Clients) -> String {
    let t = TABLE;
    let mut out = String::new();
    let _ = writeln!(out, "add table ip {t}\ndelete table ip {t}\nadd table ip {t}");
    for map in MAPS {
        let _ = writeln!(out, "add map ip {t} {map} {{ type {}; }}", map_type(map));
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
    let _ = writeln!(out, "add set ip {t} {HAIRPIN} {{ type ipv4_addr . ipv4_addr; }}");
    let _ = writeln!(out, "add chain ip {t} nat-postrouting {{ type nat hook postrouting priority 100; policy accept; }}");
    let _ = writeln!(out, "add rule ip {t} nat-postrouting meta mark & {MASQ_MARK:#x} != 0 masquerade");
    let _ = writeln!(out, "add rule ip {t} nat-postrouting ct status dnat ip saddr . ip daddr @{HAIRPIN} masquerade");
    let pairs: Vec<String> = hairpin_counts(services).keys().map(|ip| format!("{ip} . {ip}")).collect();
    if !pairs.is_empty() {
        let _ = writeln!(out, "add set ip {t} {HAIRPIN} {{ type ipv4_addr . ipv4_addr; elements = {{ {} }}; }}", pairs.join(", "));
    }
    for (chain, sp) in services.values().flatten() {
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

/// How many Service ports have each endpoint address: those with any are in the hairpin set.
fn hairpin_counts(services: &Services) -> BTreeMap<Ipv4Addr, usize> {
    let mut counts = BTreeMap::new();
    for sp in services.values().flat_map(BTreeMap::values) {
        for (ip, _) in &sp.endpoints {
            *counts.entry(*ip).or_insert(0) += 1;
        }
    }
    counts
}

/// The transaction that turns `old` into `new` (one Service's ports, or several Services'),
/// touching only the Service ports that differ; `None` when nothing does.
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
            // clients in their affinity sets. The chains of endpoints gone are emptied now and
            // deleted later, several at once: nft loads every chain of the table to delete one.
            Some(o) if only_endpoints_differ(o, sp) => {
                write_service(&mut out, chain, sp);
                for name in retired(chain, o, sp) {
                    if let Some(epc) = name.strip_prefix("chain ") {
                        let _ = writeln!(out, "flush chain ip {TABLE} {epc}");
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

/// The IP protocol number of `tcp`, `udp` or `sctp`.
fn protocol_number(p: &str) -> u8 {
    match p {
        "udp" => 17,
        "sctp" => 132,
        _ => 6,
    }
}

/// Writes chain `name` afresh with `rules`, as netlink messages.
fn nl_chain(b: &mut Batch, name: &str, rules: Vec<Vec<Expr>>) -> Result<(), NetlinkError> {
    b.add_chain(name)?;
    b.flush_chain(name)?;
    rules.into_iter().try_for_each(|r| b.add_rule(name, r))
}

/// What `write_service` writes, as netlink messages. `old` is the same Service port before a
/// change of its endpoints alone, whose chains and endpoint map are there: then, without
/// affinity, only the map's elements are written, and the rule only if the number of endpoints
/// changed. A rule with a NAT or a jump makes the kernel validate, at commit, every chain the
/// table's hooks reach; elements of a data map do not.
fn nl_service(b: &mut Batch, chain: &str, sp: &ServicePort, old: Option<&ServicePort>) -> Result<(), NetlinkError> {
    if sp.endpoints.is_empty() {
        return Ok(());
    }
    if sp.affinity_seconds.is_none() {
        let map = endpoint_map(chain);
        match old {
            Some(_) => b.flush_set(&map)?,
            None => b.add_endpoint_map(&map, sp.protocol)?,
        }
        let elements: Vec<(Vec<u8>, Vec<u8>)> = sp
            .endpoints
            .iter()
            .enumerate()
            .map(|(i, &(ip, port))| (netlink::endpoint_number_key(i), netlink::address_port(ip, port)))
            .collect();
        b.add_data_elements(&map, &elements)?;
        if old.is_none_or(|o| o.endpoints.len() != sp.endpoints.len()) {
            let modulus = u32::try_from(sp.endpoints.len()).map_err(|_| NetlinkError::TooLarge(sp.endpoints.len()))?;
            let mut pick = vec![Expr::l4proto(), Expr::equals(&[protocol_number(sp.protocol)]), Expr::random_below(modulus)];
            pick.extend(Expr::dnat_by_map(&map)?);
            nl_chain(b, chain, vec![pick])?;
        }
    } else {
        let mut targets = Vec::new();
        for &ep in &sp.endpoints {
            let epc = endpoint_chain(chain, ep);
            let set = affinity_set(&epc);
            b.add_timed_address_set(&set, sp.affinity_seconds.unwrap_or_default())?;
            let mut dnat = vec![Expr::l4proto(), Expr::equals(&[protocol_number(sp.protocol)])];
            dnat.extend(Expr::dnat(ep.0, ep.1));
            nl_chain(b, &epc, vec![vec![Expr::ip_saddr(), Expr::update_set(&set)?], dnat])?;
            targets.push(epc);
        }
        b.add_chain(chain)?;
        b.flush_chain(chain)?;
        for epc in &targets {
            b.add_rule(chain, [Expr::ip_saddr(), Expr::in_set(&affinity_set(epc))?, Expr::goto(epc)?])?;
        }
        b.add_random_pick(chain, &targets)?;
    }
    if sp.node_port.is_some() && old.is_none() {
        let rules = vec![Expr::set_mark_bits(MASQ_MARK).into(), vec![Expr::goto(chain)?]];
        nl_chain(b, &format!("ext-{}", &chain[4..]), rules)?;
    }
    Ok(())
}

/// The map elements of one Service port as netlink keys: map, key, the chain it goes to.
fn nl_elements(chain: &str, sp: &ServicePort) -> Vec<(&'static str, Vec<u8>, String)> {
    let proto = protocol_number(sp.protocol);
    let key = netlink::ip_proto_port_key(sp.cluster_ip, proto, sp.port);
    let np = sp.node_port.map(|np| netlink::proto_port_key(proto, np));
    let mut out = Vec::new();
    if sp.endpoints.is_empty() {
        out.push(("no-endpoint-services", key, "reject-chain".to_string()));
        if let Some(np) = np {
            out.push(("no-endpoint-nodeports", np, "reject-chain".to_string()));
        }
    } else {
        out.push(("service-ips", key, chain.to_string()));
        if let Some(np) = np {
            out.push(("service-nodeports", np, format!("ext-{}", &chain[4..])));
        }
    }
    out
}

/// What `diff_script` writes, as netlink messages.
fn nl_diff(b: &mut Batch, old: &Model, new: &Model) -> Result<(), NetlinkError> {
    for (chain, sp) in old {
        match new.get(chain) {
            Some(n) if n == sp || only_endpoints_differ(sp, n) => {}
            _ => {
                for (map, key, _) in nl_elements(chain, sp) {
                    b.delete_map_elements(map, &[key])?;
                }
                if sp.endpoints.is_empty() {
                    continue;
                }
                if sp.node_port.is_some() {
                    b.delete_chain(&format!("ext-{}", &chain[4..]))?;
                }
                b.delete_chain(chain)?;
                if sp.affinity_seconds.is_none() {
                    b.delete_set(&endpoint_map(chain))?;
                    continue;
                }
                for &ep in &sp.endpoints {
                    let epc = endpoint_chain(chain, ep);
                    b.delete_chain(&epc)?;
                    b.delete_set(&affinity_set(&epc))?;
                }
            }
        }
    }
    for (chain, sp) in new {
        match old.get(chain) {
            Some(o) if o == sp => {}
            Some(o) if only_endpoints_differ(o, sp) => {
                nl_service(b, chain, sp, Some(o))?;
                for name in retired(chain, o, sp) {
                    if let Some(epc) = name.strip_prefix("chain ") {
                        b.flush_chain(epc)?;
                    }
                }
            }
            _ => {
                nl_service(b, chain, sp, None)?;
                for (map, key, to) in nl_elements(chain, sp) {
                    b.add_map_elements(map, &[(key, to.as_str())])?;
                }
            }
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NftError {
    #[error("running nft (package nftables): {0}")]
    Spawn(std::io::Error),
    #[error("nft refused the rules: {0}")]
    Refused(String),
}

thread_local! {
    /// CPU time of the `nft` runs this thread waited for.
    static NFT_CPU: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// CPU time of the `nft` runs this thread waited for, so far.
fn nft_cpu() -> Duration {
    NFT_CPU.with(std::cell::Cell::get)
}

/// Runs `nft args`, with `input` on its standard input: whether it succeeded, its output and
/// its errors. Its CPU time goes to this thread's `nft_cpu`: the child is waited for with
/// `wait4`, which gives its own usage (the process's `RUSAGE_CHILDREN` would mix in the `nft`
/// runs of other threads, such as a listing running beside a change).
fn nft(args: &[&str], input: Option<&str>) -> std::io::Result<(bool, Vec<u8>, Vec<u8>)> {
    use std::io::Read as _;
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let (Some(mut stdin), Some(input)) = (child.stdin.take(), input) {
        // nft reads all of its input before it writes anything.
        stdin.write_all(input.as_bytes())?;
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_end(&mut out)?;
    }
    if let Some(mut stderr) = child.stderr.take() {
        stderr.read_to_end(&mut err)?;
    }
    let pid = libc::pid_t::try_from(child.id()).map_err(|_| std::io::Error::other("pid out of range"))?;
    let mut status = 0;
    // SAFETY: rusage is plain data, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes one int and one rusage, which `status` and `usage` are.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    let tv = |t: libc::timeval| Duration::from_micros(u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0));
    NFT_CPU.with(|c| c.set(c.get() + tv(usage.ru_utime) + tv(usage.ru_stime)));
    Ok((libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, out, err))
}

/// Feeds `script` to `nft -f -` as one transaction.
pub(crate) fn apply(script: &str) -> Result<(), NftError> {
    let (ok, _, err) = nft(&["-f", "-"], Some(script)).map_err(NftError::Spawn)?;
    if ok { Ok(()) } else { Err(NftError::Refused(String::from_utf8_lossy(&err).trim().to_string())) }
}

/// The clients of the affinity sets, by set: each as nft lists it (`10.244.1.7 timeout 3h
/// expires 2h59m`), which nft takes back as an element with the time it has left.
type Clients = BTreeMap<String, Vec<String>>;

/// The elements of the maps and of the hairpin set, by map, as nft lists them (`10.96.0.10 . tcp
/// . 80 : goto svc-default-web-tcp-80`, `0 : 10.244.0.2 . 8080`, `10.244.0.2 . 10.244.0.2`).
type Elements = BTreeMap<String, BTreeSet<String>>;

/// The kernel's copy of the table.
struct Listing {
    /// The listing without the affinity sets' clients, which traffic changes, and without the
    /// elements of the maps and the hairpin set, which are compared with the model's instead.
    rules: String,
    clients: Clients,
    elements: Elements,
}

/// The kernel's listing of the table, `None` when it is missing.
fn listing() -> Option<Listing> {
    let (ok, out, _) = nft(&["list", "table", "ip", TABLE], None).ok()?;
    ok.then(|| parse_listing(&String::from_utf8_lossy(&out)))
}

fn parse_listing(text: &str) -> Listing {
    let (mut rules, mut clients, mut elements) = (String::new(), Clients::new(), Elements::new());
    // The set or map open, and whether it is a map; the elements being read.
    let (mut set, mut open): (Option<(String, bool)>, Option<String>) = (None, None);
    for line in text.lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("set affinity-").and_then(|n| n.strip_suffix(" {")) {
            set = Some((format!("affinity-{name}"), false));
        } else if let Some(name) = l.strip_prefix("map ").or(l.strip_prefix("set ").filter(|n| n.strip_suffix(" {") == Some(HAIRPIN))).and_then(|n| n.strip_suffix(" {")) {
            // The maps' elements and the hairpin set's are compared with the model's.
            set = Some((name.to_string(), true));
            elements.entry(name.to_string()).or_default();
        } else if set.is_some() && open.is_none() && l.starts_with("elements = {") {
            open = Some(String::new());
        }
        if let Some(e) = open.as_mut() {
            e.push_str(l);
            e.push(' ');
            if l.ends_with('}') {
                let inner = e.trim().trim_start_matches("elements = {").trim_end_matches('}');
                let listed = inner.split(',').map(str::trim).filter(|c| !c.is_empty()).map(str::to_string);
                match &set {
                    Some((map, true)) => elements.entry(map.clone()).or_default().extend(listed),
                    Some((name, false)) => clients.entry(name.clone()).or_default().extend(listed),
                    None => {}
                }
                open = None;
            }
            continue;
        }
        if set.is_some() && l == "}" {
            set = None;
        }
        rules.push_str(line);
        rules.push('\n');
    }
    Listing { rules, clients, elements }
}

/// The map elements `services` call for, as nft lists them.
fn expected_elements(services: &Services) -> Elements {
    let mut out: Elements =
        MAPS.iter().map(|m| (m.to_string(), BTreeSet::new())).collect();
    for (chain, sp) in services.values().flatten() {
        for (map, e) in elements(chain, sp) {
            out.entry(map.to_string()).or_default().insert(e);
        }
        if sp.affinity_seconds.is_none() && !sp.endpoints.is_empty() {
            out.insert(endpoint_map(chain), endpoint_elements(sp).into_iter().collect());
        }
    }
    let pairs = hairpin_counts(services).into_keys().map(|ip| format!("{ip} . {ip}")).collect();
    out.insert(HAIRPIN.to_string(), pairs);
    out
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

/// The chains and sets a script writes and deletes (`chain NAME`, `set NAME`). Map elements
/// are left out: the check compares them with the model.
fn touched(script: &str) -> (Vec<String>, Vec<String>) {
    let (mut written, mut deleted) = (Vec::new(), Vec::new());
    for line in script.lines() {
        let words: Vec<&str> = line.split_whitespace().take(5).collect();
        match words.as_slice() {
            ["add", kind @ ("chain" | "set" | "map"), "ip", TABLE, name] => written.push(format!("{kind} {name}")),
            ["delete", kind @ ("chain" | "set" | "map"), "ip", TABLE, name] => deleted.push(format!("{kind} {name}")),
            _ => {}
        }
    }
    written.retain(|w| !deleted.contains(w));
    written.dedup();
    (written, deleted)
}

/// What applying changes did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Updated {
    Nothing,
    /// The changed Services' chains and elements were written.
    Changed,
    /// The table was rebuilt instead (never built, or the change was refused).
    Rebuilt,
}

/// What a check of the table did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Checked {
    /// Nobody else committed a transaction since this proxy's last: nothing was listed.
    Unchanged,
    /// The table was listed and held what this proxy left there.
    Listed,
    /// A transaction was committed while the table was listed: the listing tells nothing, and
    /// the next check lists again.
    Stale,
    /// The table differed (or was unknown) and was rebuilt.
    Rebuilt,
}

/// A check that lists the table: what it needs to compare the listing, which is taken apart
/// (`take_listing`, on a thread of its own) while changes go on.
struct PendingCheck {
    /// This proxy's transactions when the listing began: one more since makes the listing stale.
    commits: u64,
    /// The chains and sets the check wrote again just before: taken as listed.
    written: Vec<String>,
}

/// A listing of the table, between two readings of the ruleset generation.
struct Taken {
    before: Option<u32>,
    listing: Option<Listing>,
    after: Option<u32>,
    /// CPU time of the listing (`nft` and the parse).
    cpu: Duration,
}

/// Lists the table. Changes may be committed meanwhile: equal generations before and after
/// mean none was, so that the listing is the table at that generation.
fn take_listing() -> Taken {
    let (own, nft_before) = (thread_cpu(), nft_cpu());
    let before = generation::current();
    let listing = listing();
    let after = generation::current();
    Taken { before, listing, after, cpu: thread_cpu().saturating_sub(own) + nft_cpu().saturating_sub(nft_before) }
}

/// What a check begun did.
enum Begun {
    Done(Checked),
    /// The table is to be listed (`take_listing`) and the listing given to `finish_check`.
    List(PendingCheck),
}

/// What is in the kernel, as far as this proxy knows.
struct Applied {
    services: Services,
    /// Whether the table was built in full once: until then a change is a rebuild.
    built: bool,
    /// The kernel's listing as this proxy left it (without map elements and clients): taken
    /// by the listing check, less the chains and sets that changes deleted since. `None` when
    /// unknown (after a rebuild), which the next listing settles.
    reference: Option<Blocks>,
    /// The Services whose chains changes wrote since the last listing: a listing check writes
    /// them again, so that what it then lists of them is this proxy's own.
    rewritten: BTreeSet<String>,
    /// The ruleset's generation after this proxy's last transaction, while no one else's is
    /// known to have come between; `None` makes the next check list the table.
    generation: Option<u32>,
    /// How many transactions this proxy committed: a listing is this proxy's table only if none
    /// was committed while it ran.
    commits: u64,
    /// The chains (emptied) and affinity sets of endpoints gone, not yet deleted.
    retired: BTreeSet<String>,
    /// How many Service ports have each endpoint address (`hairpin_counts`), kept by changes.
    hairpin: BTreeMap<Ipv4Addr, usize>,
}

impl Applied {
    fn new() -> Applied {
        Applied {
            services: Services::new(),
            built: false,
            reference: None,
            rewritten: BTreeSet::new(),
            generation: None,
            commits: 0,
            retired: BTreeSet::new(),
            hairpin: BTreeMap::new(),
        }
    }

    /// Notes a transaction of this proxy's committed between generations `before` and `after`.
    fn committed(&mut self, before: Option<u32>, after: Option<u32>) {
        self.commits += 1;
        let only_ours = self.generation.is_some() && self.generation == before && after == before.map(|b| b.wrapping_add(1));
        self.generation = if only_ours { after } else { None };
    }

    /// Replaces the table with `services`', keeping the clients of affinity sets that the
    /// kernel's copy (`found`) has. Without `found`, the table is listed for them only if some
    /// Service has affinity. What the table then holds is settled by the next check's listing.
    fn rebuild(&mut self, services: Services, found: Option<Listing>) -> Result<(), NftError> {
        let sticky = services.values().flat_map(BTreeMap::values).any(|sp| sp.affinity_seconds.is_some());
        let found = if found.is_none() && sticky { listing() } else { found };
        let clients = found.map(|l| l.clients).unwrap_or_default();
        let before = generation::current();
        self.services = services;
        self.hairpin = hairpin_counts(&self.services);
        self.reference = None;
        self.generation = None;
        self.rewritten.clear();
        self.retired.clear();
        self.built = false;
        apply(&full_script(&self.services, &clients))?;
        self.built = true;
        let after = generation::current();
        self.commits += 1;
        // The table is this proxy's own only if no one else's transaction came between.
        if before.is_some_and(|b| after == Some(b.wrapping_add(1))) {
            self.generation = after;
        }
        Ok(())
    }

    /// Applies the ports of each Service given (`namespace/name`, its ports; none: the Service
    /// is gone) in one transaction that touches those Services' own chains and map elements
    /// only. A table never built, or a refused change (the kernel is not what was applied), is
    /// rebuilt instead.
    fn update(&mut self, changes: impl IntoIterator<Item = (String, Model)>) -> Result<Updated, NftError> {
        let (mut script, mut services) = (String::new(), std::mem::take(&mut self.services));
        // Services that go first, so that one that comes may take over what they leave.
        let mut changes: Vec<(String, Model)> = changes.into_iter().collect();
        changes.sort_by_key(|(_, ports)| !ports.is_empty());
        let mut keys = Vec::new();
        let mut retire = Vec::new();
        let mut batch = Batch::new(TABLE);
        let mut encoded = Ok(());
        // The endpoint addresses whose count changed, and whether they were in the hairpin set.
        let mut hairpin_was: BTreeMap<Ipv4Addr, bool> = BTreeMap::new();
        for (key, ports) in changes {
            let diff = diff_script(services.get(&key).unwrap_or(&Model::new()), &ports);
            let Some(diff) = diff else { continue };
            if encoded.is_ok() {
                encoded = nl_diff(&mut batch, services.get(&key).unwrap_or(&Model::new()), &ports);
            }
            for (chain, old) in services.get(&key).into_iter().flatten() {
                if let Some(new) = ports.get(chain).filter(|new| only_endpoints_differ(old, new)) {
                    retire.extend(retired(chain, old, new));
                }
            }
            let (gone, come) = (services.get(&key).into_iter().flat_map(BTreeMap::values), ports.values());
            for (sp, step) in gone.map(|sp| (sp, -1_isize)).chain(come.map(|sp| (sp, 1))) {
                for (ip, _) in &sp.endpoints {
                    let count = self.hairpin.entry(*ip).or_insert(0);
                    hairpin_was.entry(*ip).or_insert(*count > 0);
                    *count = count.saturating_add_signed(step);
                }
            }
            script.push_str(&diff);
            if ports.is_empty() {
                services.remove(&key);
            } else {
                services.insert(key.clone(), ports);
            }
            keys.push(key);
        }
        let (mut pairs_in, mut pairs_out) = (Vec::new(), Vec::new());
        for (ip, was) in hairpin_was {
            let now = self.hairpin.get(&ip).is_some_and(|c| *c > 0);
            if now && !was {
                pairs_in.push(netlink::address_pair(ip, ip));
            } else if was && !now {
                pairs_out.push(netlink::address_pair(ip, ip));
            }
            if !now {
                self.hairpin.remove(&ip);
            }
        }
        if script.is_empty() {
            self.services = services;
            return Ok(Updated::Nothing);
        }
        if !self.built {
            self.rebuild(services, None)?;
            return Ok(Updated::Rebuilt);
        }
        if encoded.is_ok() && !pairs_out.is_empty() {
            encoded = batch.delete_map_elements(HAIRPIN, &pairs_out);
        }
        if encoded.is_ok() && !pairs_in.is_empty() {
            encoded = batch.add_set_elements(HAIRPIN, &pairs_in);
        }
        let before = generation::current();
        if let Err(e) = encoded.and_then(|()| batch.commit()) {
            tracing::info!(error = %e, "nftables table differs from what was applied; rebuilding it");
            self.rebuild(services, None)?;
            return Ok(Updated::Rebuilt);
        }
        self.committed(before, generation::current());
        self.services = services;
        let (written, deleted) = touched(&script);
        if let Some(reference) = self.reference.as_mut() {
            for d in &deleted {
                reference.remove(d);
            }
        }
        self.rewritten.extend(keys);
        // An endpoint back before its chain was deleted has it again.
        self.retired.extend(retire);
        for name in written.iter().chain(&deleted) {
            self.retired.remove(name);
        }
        Ok(Updated::Changed)
    }

    /// The chains and sets of endpoints gone (`chain NAME`, `set NAME`), chains first (their
    /// flushed rules referred to the sets), which are from now on taken as deleted.
    fn take_retired(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for kind in ["chain ", "set "] {
            for name in self.retired.iter().filter(|n| n.starts_with(kind)) {
                if let Some(reference) = self.reference.as_mut() {
                    reference.remove(name);
                }
                out.push(name.clone());
            }
        }
        self.retired.clear();
        out
    }

    /// The script that deletes the chains and sets of endpoints gone.
    fn collect_script(&mut self) -> String {
        let mut out = String::new();
        for name in self.take_retired() {
            if let Some((kind, name)) = name.split_once(' ') {
                let _ = writeln!(out, "delete {kind} ip {TABLE} {name}");
            }
        }
        out
    }

    /// The transaction that deletes the chains and sets of endpoints gone.
    fn collect_batch(&mut self) -> Result<Batch, NetlinkError> {
        let mut b = Batch::new(TABLE);
        for name in self.take_retired() {
            match name.split_once(' ') {
                Some(("chain", chain)) => b.delete_chain(chain)?,
                Some(("set", set)) => b.delete_set(set)?,
                _ => {}
            }
        }
        Ok(b)
    }

    /// Rebuilds the table from the model, keeping the clients of affinity sets `found` has.
    fn rebuild_all(&mut self, found: Option<Listing>) -> Result<Checked, NftError> {
        let services = std::mem::take(&mut self.services);
        self.rebuild(services, found).map(|()| Checked::Rebuilt)
    }

    /// Begins a check of the table. Unless `full`, an unchanged ruleset generation is proof
    /// enough that it holds what this proxy left there. Otherwise the chains of changes since
    /// the last listing are written again first (each is flushed and filled, so whatever someone
    /// did to them is undone), and the table is to be listed, off this thread: `finish_check`
    /// compares it.
    fn begin_check(&mut self, full: bool) -> Result<Begun, NftError> {
        if !self.built {
            return self.rebuild_all(None).map(Begun::Done);
        }
        if !full && self.reference.is_some() && self.generation.is_some() && generation::current() == self.generation {
            if self.retired.len() >= RETIRED_BATCH {
                let batch = self.collect_batch();
                let before = generation::current();
                if batch.and_then(Batch::commit).is_err() {
                    return self.rebuild_all(None).map(Begun::Done);
                }
                self.committed(before, generation::current());
            }
            return Ok(Begun::Done(Checked::Unchanged));
        }
        let mut again = self.collect_script();
        for key in &self.rewritten {
            for (chain, sp) in self.services.get(key).into_iter().flatten() {
                write_service(&mut again, chain, sp);
            }
        }
        let (written, _) = touched(&again);
        if !again.is_empty() {
            let before = generation::current();
            if apply(&again).is_err() {
                return self.rebuild_all(None).map(Begun::Done);
            }
            self.committed(before, generation::current());
        }
        Ok(Begun::List(PendingCheck { commits: self.commits, written }))
    }

    /// Compares a listing taken for `pending` with what this proxy left in the table: the chains
    /// written again are taken from it, the rest must equal the last listing (after a rebuild,
    /// with none yet, the listing is this proxy's table if no one else committed since), and
    /// the maps and the hairpin set must hold the model's elements. If they differ, the table
    /// is rebuilt, keeping the clients of affinity sets.
    fn finish_check(&mut self, pending: PendingCheck, taken: Taken) -> Result<Checked, NftError> {
        let consistent = taken.before == taken.after;
        if self.commits != pending.commits || !consistent {
            // Changes went on meanwhile: nothing to conclude. The generation this proxy knows
            // stays as it was (a change of someone else's since moved it away), and the
            // reference too, so the next check lists again if either calls for it.
            return Ok(Checked::Stale);
        }
        let Some(found) = taken.listing else { return self.rebuild_all(None) };
        let have = blocks(&found.rules);
        let same_blocks = match &self.reference {
            Some(want) => {
                let differs = |k: &String| !pending.written.contains(k) && want.get(k) != have.get(k);
                !want.keys().chain(have.keys()).any(differs)
            }
            // Only this proxy's transactions since its rebuild.
            None => self.generation.is_some() && self.generation == taken.before,
        };
        if same_blocks && found.elements == expected_elements(&self.services) {
            self.reference = Some(have);
            self.rewritten.clear();
            self.generation = taken.before;
            return Ok(Checked::Listed);
        }
        tracing::info!("nftables table {TABLE} was changed by someone else; rebuilding it");
        self.rebuild_all(Some(found))
    }

    /// A whole check on this thread: `begin_check`, the listing if one is due, `finish_check`.
    #[cfg(test)]
    fn check(&mut self, full: bool) -> Result<Checked, NftError> {
        match self.begin_check(full)? {
            Begun::Done(checked) => Ok(checked),
            Begun::List(pending) => self.finish_check(pending, take_listing()),
        }
    }
}

/// CPU time this thread has used.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which `t` is.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

/// Keeps the table in step with Services and Endpoints: a change of one is applied, for its
/// Service alone, as soon as an informer sees it; every `resync` the table is checked (see
/// `Applied::begin_check`), and every `FULL_CHECK` the whole model is recomputed from the
/// informers' caches. A listing of the table runs on a thread of its own while changes go on,
/// and is compared at the next pass; no change waits for one.
pub(crate) fn run(manager: &Manager, resync: Duration) -> impl Future<Output = ()> + use<> {
    run_with(manager, resync, Arc::new(take_listing))
}

/// How the table is listed: `take_listing`, or in tests one that takes its time.
type Lister = Arc<dyn Fn() -> Taken + Send + Sync>;

fn run_with(manager: &Manager, resync: Duration, lister: Lister) -> impl Future<Output = ()> + use<> {
    let services = manager.informers().informer(&kinds::SERVICE);
    let endpoints = manager.informers().informer(&kinds::ENDPOINTS);
    let changed = Arc::new(tokio::sync::Notify::new());
    // The Services changed since the last pass, and when the oldest of those changes arrived
    // (for the event-to-rule latency).
    let dirty: Arc<std::sync::Mutex<(BTreeSet<String>, Option<Instant>)>> = Arc::default();
    for informer in [&services, &endpoints] {
        let (notify, dirty) = (changed.clone(), dirty.clone());
        informer.subscribe(move |change| {
            let mut d = dirty.lock().unwrap_or_else(|e| e.into_inner());
            d.0.insert(key_of(change.object()));
            d.1.get_or_insert_with(Instant::now);
            notify.notify_one();
        });
    }
    async move {
        services.wait_synced().await;
        endpoints.wait_synced().await;
        let (svc_cache, ep_cache) = (services.cache().clone(), endpoints.cache().clone());
        let mut applied = Some(Applied::new());
        let (mut next_resync, mut next_full) = (Instant::now(), Instant::now());
        // The listing under way, and the one taken, to compare at the next pass.
        let mut listing: Option<(PendingCheck, tokio::task::JoinHandle<Taken>)> = None;
        let mut taken: Option<(PendingCheck, Taken)> = None;
        loop {
            let (keys, since) = std::mem::take(&mut *dirty.lock().unwrap_or_else(|e| e.into_inner()));
            let resync_now = Instant::now() >= next_resync;
            // The whole model is recomputed in a pass of its own, never with a change, whose
            // time and CPU it would add to (at 1,000 Services, more than the change's own).
            let full_now = Instant::now() >= next_full && keys.is_empty();
            let cpu_before = thread_cpu();
            // Only the changed Services, unless it is time to recompute all of them.
            let model: Vec<(String, Model)> = if full_now {
                let all = desired(&svc_cache.list(), |key| ep_cache.get(key));
                let gone = applied.iter().flat_map(|a| a.services.keys()).filter(|k| !all.contains_key(*k));
                let gone: Vec<(String, Model)> = gone.map(|k| (k.clone(), Model::new())).collect();
                all.into_iter().chain(gone).collect()
            } else {
                let ports = |k: &String| svc_cache.get(k).map(|s| service_ports(&s, ep_cache.get(k).as_deref())).unwrap_or_default();
                keys.iter().map(|k| (k.clone(), ports(k))).collect()
            };
            let model_cpu = thread_cpu().saturating_sub(cpu_before);
            let Some(mut state) = applied.take() else { return };
            let finished = taken.take();
            let begin = resync_now && listing.is_none() && finished.is_none();
            // Netlink and nft run off the async workers.
            let joined = tokio::task::spawn_blocking(move || {
                // A listing taken is compared first: a change committed before would make it stale.
                let (own, nft, began) = (thread_cpu(), nft_cpu(), Instant::now());
                let compared = finished.map(|(pending, taken)| {
                    let listing_cpu = taken.cpu;
                    (state.finish_check(pending, taken), listing_cpu)
                });
                let compare_cpu = thread_cpu().saturating_sub(own) + nft_cpu().saturating_sub(nft);
                let compare_took = began.elapsed();
                let (own, nft) = (thread_cpu(), nft_cpu());
                let updated = state.update(model);
                let event_to_rule = since.map(|s| s.elapsed());
                let nft_cpu_used = nft_cpu().saturating_sub(nft);
                let update_cpu = thread_cpu().saturating_sub(own) + nft_cpu_used;
                let (own, nft, began) = (thread_cpu(), nft_cpu(), Instant::now());
                let begun = begin.then(|| state.begin_check(false));
                let check_cpu = thread_cpu().saturating_sub(own) + nft_cpu().saturating_sub(nft) + compare_cpu;
                (state, (updated, event_to_rule, update_cpu, nft_cpu_used), compared, begun, check_cpu, compare_took + began.elapsed())
            })
            .await;
            let Ok((state, (updated, event_to_rule, update_cpu, nft_cpu), compared, begun, check_cpu, check_took)) = joined else {
                return;
            };
            // CPU of this process and of nft, to compute the Services' ports and apply them.
            let cpu_ms = (model_cpu + update_cpu).as_secs_f64() * 1e3;
            let event_to_rule_ms = event_to_rule.map(|d| d.as_secs_f64() * 1e3).unwrap_or(0.0);
            match updated {
                Ok(Updated::Changed) => {
                    let nft_cpu_ms = nft_cpu.as_secs_f64() * 1e3;
                    tracing::info!(event_to_rule_ms, cpu_ms, nft_cpu_ms, services = keys.len(), "service rules applied")
                }
                Ok(Updated::Rebuilt) => tracing::info!(took_ms = event_to_rule_ms, cpu_ms, "service table rebuilt"),
                Ok(Updated::Nothing) => {}
                Err(e) => tracing::warn!(error = %e, "cannot apply the service rules"),
            }
            let (check_cpu_ms, took_ms) = (check_cpu.as_secs_f64() * 1e3, check_took.as_secs_f64() * 1e3);
            let mut checked = Vec::new();
            if let Some((result, listing_cpu)) = compared {
                // A listing's cost is its own thread's and the comparison's.
                checked.push((result, (listing_cpu + check_cpu).as_secs_f64() * 1e3));
            }
            match begun {
                Some(Ok(Begun::List(pending))) => {
                    let lister = lister.clone();
                    listing = Some((pending, tokio::task::spawn_blocking(move || lister())));
                }
                Some(Ok(Begun::Done(c))) => checked.push((Ok(c), check_cpu_ms)),
                Some(Err(e)) => checked.push((Err(e), check_cpu_ms)),
                None => {}
            }
            for (result, cpu_ms) in checked {
                match result {
                    Ok(Checked::Rebuilt) => tracing::info!(took_ms, cpu_ms, "service table rebuilt"),
                    Ok(Checked::Listed) => tracing::debug!(took_ms, cpu_ms, "service table listed and compared"),
                    Ok(Checked::Stale) => tracing::debug!(cpu_ms, "service table listed while it changed; listing again"),
                    Ok(Checked::Unchanged) => tracing::debug!(took_ms, cpu_ms, "service table checked"),
                    Err(e) => tracing::warn!(error = %e, "cannot check the service rules"),
                }
            }
            applied = Some(state);
            if resync_now {
                next_resync = Instant::now() + resync;
            }
            if full_now {
                next_full = Instant::now() + FULL_CHECK.max(resync);
            }
            let listed = {
                let listed = async {
                    match listing.as_mut() {
                        Some((_, handle)) => Some(handle.await),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = changed.notified() => None,
                    () = tokio::time::sleep_until(next_resync.into()) => None,
                    result = listed => result,
                }
            };
            if let Some(result) = listed {
                // A listing that failed to run is simply taken again at the next resync.
                if let (Some((pending, _)), Ok(result)) = (listing.take(), result) {
                    taken = Some((pending, result));
                }
            }
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

    fn services(services: &[Arc<Value>], eps: &[(&str, Arc<Value>)]) -> Services {
        let eps: HashMap<String, Arc<Value>> = eps.iter().map(|(k, v)| (format!("default/{k}"), v.clone())).collect();
        desired(services, |key| eps.get(key).cloned())
    }

    /// Every Service port, by chain.
    fn model(svcs: &[Arc<Value>], eps: &[(&str, Arc<Value>)]) -> Model {
        services(svcs, eps).into_values().flatten().collect()
    }

    fn root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test needs root (a network namespace of its own for nft)");
        }
    }

    /// A table built from `services` and listed once, as the agent's first checks leave it.
    fn built(services: Services) -> Applied {
        let mut applied = Applied::new();
        applied.rebuild(services, None).expect("full table");
        assert_eq!(applied.check(false).expect("the first check"), Checked::Listed, "a rebuild is listed once");
        applied
    }

    /// `sticky` with `sessionAffinity: ClientIP` for `timeout` seconds.
    fn with_affinity(svc: &Arc<Value>, timeout: u64) -> Arc<Value> {
        let mut sticky = (**svc).clone();
        sticky["spec"]["sessionAffinity"] = json!("ClientIP");
        sticky["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": timeout}});
        Arc::new(sticky)
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
        assert!(!script.contains("add rule"), "rules go in their chains' blocks: {script}");
        assert!(!script.contains("chain ip shepherd ep-"), "no chain per endpoint: {script}");
        assert!(script.contains("elements = { 0 : 10.244.0.3 . 8080 }"), "{script}");
        assert!(script.contains("dnat to numgen random mod 1 map @eps-default-web-tcp-80"), "{script}");
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
        let svcs = [service("web", "10.96.0.10", Some(30080))];
        let before = model(&svcs, &[("web", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let after = model(&svcs, &[("web", endpoints(&[], &["10.244.0.2"]))]);
        let full = services(&svcs, &[("web", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let listed = in_private_netns(move || {
            apply(&full_script(&full, &Clients::new())).expect("full table");
            apply(&diff_script(&before, &after).expect("a change")).expect("the change");
            listing().expect("the table")
        });
        let (rules, elements) = (listed.rules, listed.elements);
        assert!(elements["no-endpoint-services"].contains("10.96.0.10 . tcp . 80 : goto reject-chain"), "{elements:?}");
        assert!(elements["no-endpoint-nodeports"].contains("tcp . 30080 : goto reject-chain"), "{elements:?}");
        assert!(elements["service-ips"].is_empty() && elements["service-nodeports"].is_empty(), "{elements:?}");
        assert!(!rules.contains("svc-default-web") && !rules.contains("eps-default-web"), "its chain and map are gone:\n{rules}");
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
        assert!(script.contains("flush chain ip shepherd ep-default-web-tcp-80-10.244.0.3-8080"), "{script}");
        assert!(!script.contains("delete"), "what goes is deleted later: {script}");
        let (chain, old, new) = ("svc-default-web-tcp-80", &before["svc-default-web-tcp-80"], &after["svc-default-web-tcp-80"]);
        let gone = ["set affinity-default-web-tcp-80-10.244.0.3-8080", "chain ep-default-web-tcp-80-10.244.0.3-8080"];
        assert_eq!(retired(chain, old, new), gone);
        assert!(!script.contains("delete element"), "the map elements stay: {script}");
    }

    #[test]
    fn clients_stick_across_a_service_added_a_rebuild_and_a_change_of_their_services_other_endpoints() {
        root();
        let mut sticky = (*service("sticky", "10.96.0.12", None)).clone();
        sticky["spec"]["sessionAffinity"] = json!("ClientIP");
        let sticky = Arc::new(sticky);
        let two = services(std::slice::from_ref(&sticky), &[("sticky", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
        let other = services(&[service("other", "10.96.0.13", None)], &[("other", endpoints(&["10.244.0.9"], &[]))]);
        let moved = services(std::slice::from_ref(&sticky), &[("sticky", endpoints(&["10.244.0.2", "10.244.0.4"], &[]))]);
        let (checks, clients) = in_private_netns(move || {
            let mut applied = built(two);
            let add = format!("add element ip {TABLE} affinity-default-sticky-tcp-80-10.244.0.2-8080 {{ 10.244.1.7 }}");
            apply(&add).expect("a client");
            applied.update(other).expect("an unrelated Service");
            let mut checks = vec![applied.check(true).expect("a check")];
            apply(&format!("flush chain ip {TABLE} svc-default-other-tcp-80")).expect("damage");
            checks.push(applied.check(false).expect("a check"));
            applied.update(moved).expect("the other endpoint replaced");
            (checks, listing().expect("the table").clients)
        });
        assert_eq!(checks, [Checked::Listed, Checked::Rebuilt], "a Service added needs no rebuild; damage does");
        let kept = clients.get("affinity-default-sticky-tcp-80-10.244.0.2-8080").cloned().unwrap_or_default();
        assert!(kept.len() == 1 && kept[0].starts_with("10.244.1.7 ") && kept[0].contains("expires"), "{clients:?}");
    }

    #[test]
    fn an_endpoint_change_needs_no_rebuild_but_damage_anywhere_after_it_is_repaired() {
        root();
        let svcs = [service("web", "10.96.0.10", Some(30080)), service("api", "10.96.0.11", None)];
        let before = services(&svcs, &[("web", endpoints(&["10.244.0.2", "10.244.0.3"], &[])), ("api", endpoints(&["10.244.1.2"], &[]))]);
        let after = services(&svcs, &[("web", endpoints(&["10.244.0.2", "10.244.0.4"], &[])), ("api", endpoints(&["10.244.1.2"], &[]))]);
        let (checks, chains) = in_private_netns(move || {
            let mut applied = built(before);
            let mut checks = Vec::new();
            applied.update(after).expect("an endpoint change");
            checks.push(applied.check(false).expect("a check"));
            // Someone empties the chain the change just wrote, then one it left alone.
            for chain in ["svc-default-web-tcp-80", "svc-default-api-tcp-80"] {
                apply(&format!("flush chain ip {TABLE} {chain}")).expect("flush");
                checks.push(applied.check(false).expect("a check"));
                checks.push(applied.check(false).expect("a check"));
            }
            let blocks = blocks(&listing().expect("the table").rules);
            let chain = |name: &str| blocks.get(&format!("chain {name}")).cloned().unwrap_or_default();
            (checks, [chain("svc-default-web-tcp-80"), chain("svc-default-api-tcp-80")])
        });
        use Checked::*;
        // The chain the change wrote is written again by the check that lists; the other one is
        // not this proxy's to trust, so the table is rebuilt, and listed at the next check.
        assert_eq!(checks, [Unchanged, Listed, Unchanged, Rebuilt, Listed], "listed only when someone else changed the table");
        assert!(chains[0].contains("dnat ip to numgen random mod 2 map @eps-default-web-tcp-80"), "{}", chains[0]);
        assert!(chains[1].contains("dnat ip to numgen random mod 1 map @eps-default-api-tcp-80"), "{}", chains[1]);
    }

    #[test]
    fn a_service_added_or_removed_writes_or_deletes_only_its_own_chains_and_elements() {
        let api = model(&[service("api", "10.96.0.11", Some(30080))], &[("api", endpoints(&["10.244.1.2", "10.244.1.3"], &[]))]);
        let added = diff_script(&Model::new(), &api).expect("a Service added");
        let removed = diff_script(&api, &Model::new()).expect("a Service removed");
        for script in [&added, &removed] {
            let names = script.lines().filter_map(|l| l.split_whitespace().nth(4));
            let foreign: Vec<&str> = names.filter(|n| !n.contains("default-api-tcp-80") && !MAPS.contains(n)).collect();
            assert!(foreign.is_empty(), "{foreign:?} in\n{script}");
        }
        assert!(added.contains("elements = { 10.96.0.11 . tcp . 80 : goto svc-default-api-tcp-80 }"), "{added}");
        assert!(added.contains("elements = { tcp . 30080 : goto ext-default-api-tcp-80 }"), "{added}");
        assert!(removed.contains("delete element ip shepherd service-ips { 10.96.0.11 . tcp . 80 }"), "{removed}");
        assert!(removed.contains("delete map ip shepherd eps-default-api-tcp-80"), "{removed}");
        assert!(!removed.contains("add "), "{removed}");
    }

    #[test]
    fn services_come_and_go_without_a_rebuild_and_an_element_deleted_by_hand_comes_back() {
        root();
        let web = services(&[service("web", "10.96.0.10", None)], &[("web", endpoints(&["10.244.0.2"], &[]))]);
        let api = services(&[service("api", "10.96.0.11", Some(30080))], &[("api", endpoints(&["10.244.1.2"], &[]))]);
        let (checks, listed) = in_private_netns(move || {
            let mut applied = built(web);
            applied.update(api).expect("a Service added");
            let mut checks = vec![applied.check(false).expect("a check"), applied.check(true).expect("a full check")];
            applied.update([("default/web".to_string(), Model::new())]).expect("a Service removed");
            checks.push(applied.check(true).expect("a full check"));
            let listed = listing().expect("the table");
            apply(&format!("delete element ip {TABLE} service-ips {{ 10.96.0.11 . tcp . 80 }}")).expect("damage");
            checks.push(applied.check(false).expect("a check"));
            (checks, (listed, listing().expect("the table")))
        });
        assert_eq!(checks, [Checked::Unchanged, Checked::Listed, Checked::Listed, Checked::Rebuilt]);
        let (removed, repaired) = listed;
        let ips = &removed.elements["service-ips"];
        assert_eq!(ips.iter().collect::<Vec<_>>(), ["10.96.0.11 . tcp . 80 : goto svc-default-api-tcp-80"]);
        assert!(!removed.rules.contains("default-web"), "{}", removed.rules);
        assert!(removed.elements["service-nodeports"].contains("tcp . 30080 : goto ext-default-api-tcp-80"), "{:?}", removed.elements);
        assert_eq!(repaired.elements["service-ips"], *ips, "the element deleted by hand is back");
    }

    #[test]
    fn the_chains_of_endpoints_gone_of_a_service_with_affinity_are_emptied_at_once_and_deleted_together_later() {
        root();
        let sticky = with_affinity(&service("web", "10.96.0.10", None), 60);
        let web = |ip: &str| services(std::slice::from_ref(&sticky), &[("web", endpoints(&[ip], &[]))]);
        let (first, second, third) = (web("10.244.0.2"), web("10.244.0.3"), web("10.244.0.4"));
        let (emptied, checks, after) = in_private_netns(move || {
            let mut applied = built(first);
            applied.update(second).expect("an endpoint change");
            applied.update(third).expect("another");
            let emptied = blocks(&listing().expect("the table").rules);
            let checks = [applied.check(false).expect("a check"), applied.check(true).expect("a full check")];
            (emptied, checks, blocks(&listing().expect("the table").rules))
        });
        for gone in ["ep-default-web-tcp-80-10.244.0.2-8080", "ep-default-web-tcp-80-10.244.0.3-8080"] {
            let chain = format!("chain {gone}");
            assert_eq!(emptied.get(&chain).map(String::as_str), Some(""), "{chain} is emptied: {emptied:?}");
            assert!(!after.contains_key(&chain), "{chain} is deleted by the check that lists: {after:?}");
            let set = format!("set affinity-{}", &gone[3..]);
            assert!(emptied.contains_key(&set) && !after.contains_key(&set), "{set} is deleted with it: {after:?}");
        }
        assert_eq!(checks, [Checked::Unchanged, Checked::Listed], "deleting them is no damage to repair");
        assert!(after["chain svc-default-web-tcp-80"].contains("goto ep-default-web-tcp-80-10.244.0.4-8080"), "{after:?}");
    }

    #[test]
    fn the_table_is_listed_only_when_someone_else_committed_a_transaction() {
        root();
        let web = services(&[service("web", "10.96.0.10", None)], &[("web", endpoints(&["10.244.0.2"], &[]))]);
        let moved = services(&[service("web", "10.96.0.10", None)], &[("web", endpoints(&["10.244.0.3"], &[]))]);
        let (steps, checks) = in_private_netns(move || {
            let g0 = generation::current().expect("the ruleset generation");
            apply("add table ip unrelated").expect("a transaction");
            let g1 = generation::current();
            let _ = listing();
            let steps = (g0, g1, generation::current());
            let mut applied = built(web);
            applied.update(moved).expect("an endpoint change");
            let mut checks = vec![applied.check(false).expect("a check"), applied.check(false).expect("a check")];
            apply("add chain ip unrelated c").expect("someone else's transaction");
            checks.push(applied.check(false).expect("a check"));
            checks.push(applied.check(false).expect("a check"));
            (steps, checks)
        });
        let (g0, g1, g2) = steps;
        assert_eq!((g1, g2), (Some(g0.wrapping_add(1)), g1), "one per transaction, none for a listing");
        assert_eq!(checks, [Checked::Unchanged, Checked::Unchanged, Checked::Listed, Checked::Unchanged]);
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
        let m = services(&[Arc::new(sticky)], &[("sticky", endpoints(&["10.244.0.2", "10.244.0.3"], &[]))]);
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

    #[test]
    fn an_endpoint_change_over_netlink_shows_in_nfts_listing_and_leaves_the_table_as_a_rebuild_would() {
        root();
        let svcs = [service("web", "10.96.0.10", Some(30080)), with_affinity(&service("sticky", "10.96.0.12", Some(30081)), 60)];
        let at = |web: &[&str], sticky: &[&str]| {
            services(&svcs, &[("web", endpoints(web, &[])), ("sticky", endpoints(sticky, &[]))])
        };
        let (first, second, third) =
            (at(&["10.244.0.2"], &["10.244.0.5"]), at(&["10.244.0.2", "10.244.0.3"], &["10.244.0.6"]), at(&[], &["10.244.0.6"]));
        let api = services(&[service("api", "10.96.0.11", None)], &[("api", endpoints(&["10.244.1.2"], &[]))]);
        let (updates, listed, checks, emptied) = in_private_netns(move || {
            let mut applied = built(first);
            let mut updates = vec![applied.update(second).expect("endpoints added"), applied.update(api).expect("a Service added")];
            let out = Command::new("nft").args(["list", "table", "ip", TABLE]).output().expect("nft list");
            let listed = String::from_utf8_lossy(&out.stdout).into_owned();
            let checks = [applied.check(false).expect("a check"), applied.check(true).expect("a full check")];
            updates.push(applied.update(third).expect("every endpoint gone"));
            (updates, listed, checks, listing().expect("the table").elements)
        });
        assert_eq!(updates, [Updated::Changed; 3], "changes, not rebuilds");
        for line in [
            "meta l4proto tcp dnat ip to numgen random mod 2 map @eps-default-web-tcp-80",
            "elements = { 0 : 10.244.0.2 . 8080, 1 : 10.244.0.3 . 8080 }",
            "typeof numgen random mod 1 : ip daddr . tcp dport",
            "10.244.0.3 . 10.244.0.3",
            "ct status dnat ip saddr . ip daddr @hairpin masquerade",
            "meta l4proto tcp dnat to 10.244.0.6:8080",
            "update @affinity-default-sticky-tcp-80-10.244.0.6-8080 { ip saddr }",
            "ip saddr @affinity-default-sticky-tcp-80-10.244.0.6-8080 goto ep-default-sticky-tcp-80-10.244.0.6-8080",
            "10.96.0.11 . tcp . 80 : goto svc-default-api-tcp-80",
        ] {
            assert!(listed.contains(line), "{line:?} is not in\n{listed}");
        }
        assert!(listed.contains("set affinity-default-sticky-tcp-80-10.244.0.6-8080") && listed.contains("timeout 1m"), "{listed}");
        assert_eq!(checks, [Checked::Unchanged, Checked::Listed], "the check that lists finds what a rebuild would leave");
        assert!(emptied["no-endpoint-services"].contains("10.96.0.10 . tcp . 80 : goto reject-chain"), "{emptied:?}");
        assert!(emptied["no-endpoint-nodeports"].contains("tcp . 30080 : goto reject-chain"), "{emptied:?}");
        assert!(!emptied["service-ips"].iter().any(|e| e.contains("10.96.0.10")), "{emptied:?}");
        assert!(!emptied.contains_key("eps-default-web-tcp-80"), "its endpoint map is gone: {emptied:?}");
        assert!(!emptied[HAIRPIN].iter().any(|e| e.starts_with("10.244.0.2 ")), "{emptied:?}");
    }

    #[test]
    fn a_change_reaches_the_kernel_while_a_listing_of_the_table_is_held_up() {
        use shepherd_apiserver::{ApiServer, HttpConfig};
        use shepherd_runtime::Client;
        use shepherd_store::{HistoryLimits, LocalStore};
        root();
        let with_meta = |mut obj: Value, kind: &str| {
            obj["apiVersion"] = json!("v1");
            obj["kind"] = json!(kind);
            obj["metadata"] = json!({"namespace": "default", "name": "web"});
            obj
        };
        let in_map = |element: &str| {
            let out = Command::new("nft").args(["list", "map", "ip", TABLE, "eps-default-web-tcp-80"]).output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(element))
        };
        in_private_netns(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
            runtime.block_on(async move {
                let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
                let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
                let client: Arc<dyn Client> = Arc::new(server.client());
                let svc = (*service("web", "10.96.0.10", None)).clone();
                client.create(&kinds::SERVICE, Some("default"), with_meta(svc.clone(), "Service")).await.expect("the Service");
                let eps = |ip: &str| with_meta((*endpoints(&[ip], &[])).clone(), "Endpoints");
                client.create(&kinds::ENDPOINTS, Some("default"), eps("10.244.0.2")).await.expect("its Endpoints");
                // A listing that says it began, then waits until the test lets it go on (at the
                // latest when the gate drops, so that a failure ends the test rather than hangs it).
                let (began, mut listing_began) = tokio::sync::mpsc::unbounded_channel();
                let gate = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
                struct Opens(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);
                impl Drop for Opens {
                    fn drop(&mut self) {
                        let (open, opened) = &*self.0;
                        *open.lock().unwrap_or_else(|e| e.into_inner()) = true;
                        opened.notify_all();
                    }
                }
                let opens = Opens(gate.clone());
                let held = gate.clone();
                let lister: Lister = Arc::new(move || {
                    let _ = began.send(());
                    let (open, opened) = &*held;
                    let mut open = open.lock().unwrap_or_else(|e| e.into_inner());
                    while !*open {
                        open = opened.wait(open).unwrap_or_else(|e| e.into_inner());
                    }
                    take_listing()
                });
                let manager = Manager::new(client.clone());
                let proxy = tokio::spawn(run_with(&manager, Duration::from_millis(50), lister));
                manager.informers().start();
                // The first build is listed by the first check, which is held.
                let began = tokio::time::timeout(Duration::from_secs(30), listing_began.recv()).await;
                assert!(matches!(began, Ok(Some(()))), "the first check lists the table");
                assert!(in_map("0 : 10.244.0.2 . 8080"), "the table is built before it is listed");
                client.update(&kinds::ENDPOINTS, Some("default"), eps("10.244.0.3")).await.expect("an endpoint change");
                let deadline = Instant::now() + Duration::from_secs(30);
                while !in_map("0 : 10.244.0.3 . 8080") {
                    assert!(Instant::now() < deadline, "the change waited for the listing of the table");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                drop(opens);
                proxy.abort();
            });
        });
    }

    #[test]
    fn a_service_whose_names_the_kernel_cannot_take_is_a_clear_error_and_a_big_one_still_applies() {
        root();
        let name = "a".repeat(253);
        let bad = model(&[service(&name, "10.96.0.20", None)], &[(name.as_str(), endpoints(&["10.244.0.2"], &[]))]);
        let mut batch = Batch::new(TABLE);
        let e = nl_diff(&mut batch, &Model::new(), &bad).expect_err("names over 255 bytes");
        assert!(e.to_string().contains("more than the kernel's 255"), "{e}");
        // Thousands of endpoints take several element messages and a transaction larger than a
        // netlink socket takes by default.
        let many: Vec<String> = (0..3000).map(|i| format!("10.244.{}.{}", i / 250, i % 250 + 2)).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let big = services(&[service("big", "10.96.0.21", None)], &[("big", endpoints(&many, &[]))]);
        let small = services(&[service("web", "10.96.0.10", None)], &[("web", endpoints(&["10.244.0.2"], &[]))]);
        let (updated, listed, refused) = in_private_netns(move || {
            let mut applied = built(small);
            let updated = applied.update(big).expect("a Service of 3,000 endpoints");
            let out = Command::new("nft").args(["list", "table", "ip", TABLE]).output().expect("nft list");
            // A change the kernel refuses names what it refused.
            let mut gone = Batch::new(TABLE);
            gone.delete_chain("no-such-chain").expect("a name that fits");
            (updated, String::from_utf8_lossy(&out.stdout).into_owned(), gone.commit().expect_err("no such chain").to_string())
        });
        assert_eq!(updated, Updated::Changed);
        assert!(listed.contains("numgen random mod 3000 map @eps-default-big-tcp-80"), "{}", &listed[..listed.len().min(2000)]);
        assert!(listed.contains("2999 : 10.244.11.251 . 8080"), "{}", &listed[..listed.len().min(2000)]);
        assert!(refused.contains("delete chain no-such-chain") && refused.contains("No such file"), "{refused}");
    }
}
