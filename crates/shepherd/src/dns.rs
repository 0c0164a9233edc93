//! Cluster DNS: answers `<svc>.<ns>.svc.<domain>` from the Service and Endpoints caches, forwards other names.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, SOA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use serde_json::{Value, json};
use shepherd_api::{JsonPath, kinds, str_at};
use shepherd_runtime::{Cache, Client, ListParams, Manager};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// Records' time to live: short, as CoreDNS's kubernetes plugin, so a changed Service is seen soon.
const TTL: u32 = 5;
/// How long a forwarded query waits for the upstream server.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// A TCP client that sends nothing for this long is dropped.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Largest UDP answer without EDNS (RFC 1035 4.2.1).
const UDP_PLAIN_MAX: usize = 512;

#[derive(Args, Clone, Debug)]
pub struct DnsArgs {
    /// Serve cluster DNS (UDP and TCP) on this address, e.g. 127.0.0.1:53; off when unset.
    #[arg(long)]
    pub cluster_dns_listen: Option<SocketAddr>,
    /// The DNS domain of the cluster's names.
    #[arg(long, default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Where names outside the cluster domain are forwarded (repeatable); by default the
    /// nameservers of /etc/resolv.conf.
    #[arg(long = "dns-upstream", value_name = "ADDR")]
    pub dns_upstream: Vec<SocketAddr>,
}

/// The objects a zone answers from.
pub trait Objects: Send + Sync {
    fn service(&self, namespace: &str, name: &str) -> Option<Arc<Value>>;
    fn endpoints(&self, namespace: &str, name: &str) -> Option<Arc<Value>>;
    fn namespace_has_services(&self, namespace: &str) -> bool;
}

/// The engine's informer caches of Services and Endpoints.
pub struct CacheObjects {
    services: Arc<Cache>,
    endpoints: Arc<Cache>,
}

impl CacheObjects {
    pub fn new(manager: &Manager) -> Self {
        CacheObjects {
            services: manager.informers().cache(&kinds::SERVICE),
            endpoints: manager.informers().cache(&kinds::ENDPOINTS),
        }
    }
}

impl Objects for CacheObjects {
    fn service(&self, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.services.get(&format!("{namespace}/{name}"))
    }
    fn endpoints(&self, namespace: &str, name: &str) -> Option<Arc<Value>> {
        self.endpoints.get(&format!("{namespace}/{name}"))
    }
    fn namespace_has_services(&self, namespace: &str) -> bool {
        !self.services.by_namespace(namespace).is_empty()
    }
}

/// What the zone says about one name and type.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// The name is outside the cluster domain.
    NotOurs,
    /// The name does not exist.
    NxDomain,
    /// The name exists; these are its records of the asked type (none: NODATA).
    Records(Vec<Rec>),
}

/// One record, before it becomes wire format.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rec {
    A(Ipv4Addr),
    /// priority, weight, port, target (absolute, without the final dot)
    Srv(u16, u16, u16, String),
}

/// A Service with no cluster IP of its own: its name answers with its endpoints' addresses.
fn headless(svc: &Value) -> bool {
    matches!(str_at(svc, "/spec/clusterIP"), "" | "None")
}

/// The ready addresses of an Endpoints object, with their hostnames.
fn ready_addresses(ep: &Value) -> Vec<(Ipv4Addr, String)> {
    let mut out = BTreeSet::new();
    for subset in ep.at("/subsets").and_then(Value::as_array).into_iter().flatten() {
        for addr in subset.at("/addresses").and_then(Value::as_array).into_iter().flatten() {
            if let Ok(ip) = str_at(addr, "/ip").parse::<Ipv4Addr>() {
                out.insert((ip, str_at(addr, "/hostname").to_string()));
            }
        }
    }
    out.into_iter().collect()
}

/// The label naming one endpoint of a headless Service: its hostname, else its dashed address.
fn endpoint_label(ip: Ipv4Addr, hostname: &str) -> String {
    if hostname.is_empty() { ip.to_string().replace('.', "-") } else { hostname.to_ascii_lowercase() }
}

/// The port number and protocol of the Service port named `name` (SRV's `_<port>._<proto>`).
fn named_port(svc: &Value, name: &str, proto: &str) -> Option<u16> {
    svc.at("/spec/ports").and_then(Value::as_array)?.iter().find_map(|p| {
        let protocol = match str_at(p, "/protocol") {
            "" => "tcp".to_string(),
            other => other.to_ascii_lowercase(),
        };
        (str_at(p, "/name").eq_ignore_ascii_case(name) && protocol == proto)
            .then(|| p.at("/port").and_then(Value::as_u64).and_then(|n| u16::try_from(n).ok()))
            .flatten()
    })
}

/// `10-244-1-5` as an address.
fn dashed_ip(label: &str) -> Option<Ipv4Addr> {
    let dotted = label.replace('-', ".");
    (label.split('-').count() == 4).then(|| dotted.parse().ok()).flatten()
}

/// The records of cluster names, after the Kubernetes DNS specification's schema.
pub struct Zone<O> {
    domain: String,
    objects: O,
}

impl<O: Objects> Zone<O> {
    pub fn new(domain: &str, objects: O) -> Self {
        Zone { domain: domain.trim_matches('.').to_ascii_lowercase(), objects }
    }

    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// The answer for `name` (any case, with or without the final dot) and `qtype`.
    pub fn answer(&self, name: &str, qtype: RecordType) -> Answer {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let rest = if name == self.domain {
            ""
        } else {
            match name.strip_suffix(&self.domain).and_then(|r| r.strip_suffix('.')) {
                Some(r) => r,
                None => return Answer::NotOurs,
            }
        };
        // Labels nearest the domain first: ["svc", ns, svc-name, ...].
        let labels: Vec<&str> = if rest.is_empty() { Vec::new() } else { rest.rsplit('.').collect() };
        let none = Answer::Records(Vec::new());
        match labels.as_slice() {
            [] | ["svc"] | ["pod"] => none,
            ["svc", ns] => if self.objects.namespace_has_services(ns) { none } else { Answer::NxDomain },
            ["svc", ns, svc] => self.service_name(ns, svc, qtype),
            ["svc", ns, svc, endpoint] => self.endpoint_name(ns, svc, endpoint, qtype),
            ["svc", ns, svc, proto, port] => match (port.strip_prefix('_'), proto.strip_prefix('_')) {
                (Some(port), Some(proto)) => self.srv(ns, svc, port, proto, qtype),
                _ => Answer::NxDomain,
            },
            ["pod", _ns, ip] => match dashed_ip(ip) {
                Some(ip) if qtype == RecordType::A => Answer::Records(vec![Rec::A(ip)]),
                Some(_) => none,
                None => Answer::NxDomain,
            },
            _ => Answer::NxDomain,
        }
    }

    fn service_name(&self, ns: &str, name: &str, qtype: RecordType) -> Answer {
        let Some(svc) = self.objects.service(ns, name) else { return Answer::NxDomain };
        if qtype != RecordType::A {
            return Answer::Records(Vec::new());
        }
        if !headless(&svc) {
            return match str_at(&svc, "/spec/clusterIP").parse() {
                Ok(ip) => Answer::Records(vec![Rec::A(ip)]),
                // An address of another family (IPv6) has no A record.
                Err(_) => Answer::Records(Vec::new()),
            };
        }
        let addrs = self.objects.endpoints(ns, name).map(|ep| ready_addresses(&ep)).unwrap_or_default();
        Answer::Records(addrs.into_iter().map(|(ip, _)| Rec::A(ip)).collect())
    }

    fn endpoint_name(&self, ns: &str, name: &str, endpoint: &str, qtype: RecordType) -> Answer {
        let Some(svc) = self.objects.service(ns, name) else { return Answer::NxDomain };
        if !headless(&svc) {
            return Answer::NxDomain;
        }
        let addrs = self.objects.endpoints(ns, name).map(|ep| ready_addresses(&ep)).unwrap_or_default();
        let ips: Vec<Rec> =
            addrs.iter().filter(|(ip, host)| endpoint_label(*ip, host) == endpoint).map(|(ip, _)| Rec::A(*ip)).collect();
        match (ips.is_empty(), qtype) {
            (true, _) => Answer::NxDomain,
            (false, RecordType::A) => Answer::Records(ips),
            (false, _) => Answer::Records(Vec::new()),
        }
    }

    fn srv(&self, ns: &str, name: &str, port: &str, proto: &str, qtype: RecordType) -> Answer {
        let Some(svc) = self.objects.service(ns, name) else { return Answer::NxDomain };
        let Some(number) = named_port(&svc, port, proto) else { return Answer::NxDomain };
        if qtype != RecordType::SRV {
            return Answer::Records(Vec::new());
        }
        let service = format!("{name}.{ns}.svc.{}", self.domain);
        if !headless(&svc) {
            return Answer::Records(vec![Rec::Srv(0, 100, number, service)]);
        }
        // A headless Service's port is its endpoints' port of the same name.
        let ep = self.objects.endpoints(ns, name);
        let addrs = ep.as_deref().map(ready_addresses).unwrap_or_default();
        let target_port = ep
            .as_deref()
            .and_then(|ep| ep.at("/subsets").and_then(Value::as_array))
            .into_iter()
            .flatten()
            .flat_map(|subset| subset.at("/ports").and_then(Value::as_array).into_iter().flatten())
            .find(|p| str_at(p, "/name").eq_ignore_ascii_case(port))
            .and_then(|p| p.at("/port").and_then(Value::as_u64))
            .and_then(|n| u16::try_from(n).ok())
            .unwrap_or(number);
        let weight = u16::try_from(100 / addrs.len().max(1)).unwrap_or(1).max(1);
        let records = addrs
            .into_iter()
            .map(|(ip, host)| Rec::Srv(0, weight, target_port, format!("{}.{service}", endpoint_label(ip, &host))))
            .collect();
        Answer::Records(records)
    }
}

/// A resolver's nameservers from resolv.conf text, on port 53.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// Serves DNS on one address over UDP and TCP.
pub struct DnsServer<O> {
    zone: Zone<O>,
    upstreams: Vec<SocketAddr>,
}

impl<O: Objects + 'static> DnsServer<O> {
    pub fn new(zone: Zone<O>, upstreams: Vec<SocketAddr>) -> Arc<Self> {
        Arc::new(DnsServer { zone, upstreams })
    }

    /// Binds UDP and TCP on `addr`; returns the bound address and runs until `stop` resolves.
    pub async fn serve(
        self: Arc<Self>,
        addr: SocketAddr,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let udp = Arc::new(UdpSocket::bind(addr).await.map_err(|e| anyhow::anyhow!("cluster DNS on udp {addr}: {e}"))?);
        let bound = udp.local_addr()?;
        let tcp = TcpListener::bind(bound).await.map_err(|e| anyhow::anyhow!("cluster DNS on tcp {bound}: {e}"))?;
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = stop => {}
                _ = self.clone().run_udp(udp) => {}
                _ = self.run_tcp(tcp) => {}
            }
        });
        Ok((bound, task))
    }

    async fn run_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        let mut buf = vec![0u8; 65535];
        loop {
            let (n, peer) = match socket.recv_from(&mut buf).await {
                Ok(r) => r,
                Err(e) => {
                    // ICMP errors from earlier replies surface here; the socket itself is fine.
                    tracing::debug!(error = %e, "cluster DNS: udp receive");
                    continue;
                }
            };
            let packet = buf[..n].to_vec();
            let server = self.clone();
            let socket = socket.clone();
            tokio::spawn(async move {
                if let Some(reply) = server.handle(&packet, true).await {
                    let _ = socket.send_to(&reply, peer).await;
                }
            });
        }
    }

    async fn run_tcp(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let server = self.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(300), server.tcp_connection(stream)).await;
            });
        }
    }

    async fn tcp_connection(&self, mut stream: TcpStream) {
        loop {
            let Ok(Ok(len)) = tokio::time::timeout(TCP_IDLE, stream.read_u16()).await else { return };
            let mut packet = vec![0u8; usize::from(len)];
            if stream.read_exact(&mut packet).await.is_err() {
                return;
            }
            let Some(reply) = self.handle(&packet, false).await else { return };
            let Ok(len) = u16::try_from(reply.len()) else { return };
            if stream.write_u16(len).await.is_err() || stream.write_all(&reply).await.is_err() {
                return;
            }
        }
    }

    /// The reply to one packet, or `None` to stay silent (not a query, or not decodable).
    pub async fn handle(&self, packet: &[u8], udp: bool) -> Option<Vec<u8>> {
        let request = match Message::from_vec(packet) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "cluster DNS: malformed packet ignored");
                return None;
            }
        };
        if request.metadata.message_type != MessageType::Query {
            return None;
        }
        let id = request.metadata.id;
        let op = request.metadata.op_code;
        let reply = match (op, request.queries.as_slice()) {
            (OpCode::Query, [query]) => match self.zone.answer(&query.name().to_ascii(), query.query_type()) {
                Answer::NotOurs => return self.forward(packet, udp).await,
                answer => self.response(&request, query, answer),
            },
            (OpCode::Query, _) => Message::error_msg(id, op, ResponseCode::FormErr),
            _ => Message::error_msg(id, op, ResponseCode::NotImp),
        };
        let bytes = reply.to_vec().ok()?;
        let max = request.edns.as_ref().map_or(UDP_PLAIN_MAX, |e| usize::from(e.max_payload()).max(UDP_PLAIN_MAX));
        if udp && bytes.len() > max {
            return reply.truncate().to_vec().ok();
        }
        Some(bytes)
    }

    fn response(&self, request: &Message, query: &Query, answer: Answer) -> Message {
        let mut reply = Message::response(request.metadata.id, OpCode::Query);
        reply.metadata.authoritative = true;
        reply.metadata.recursion_desired = request.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        reply.add_query(query.clone());
        let name = query.name().clone();
        match answer {
            Answer::Records(records) if !records.is_empty() => {
                for rec in records {
                    let rdata = match rec {
                        Rec::A(ip) => RData::A(A(ip)),
                        Rec::Srv(priority, weight, port, target) => match Name::from_ascii(format!("{target}.")) {
                            Ok(target) => RData::SRV(SRV::new(priority, weight, port, target)),
                            Err(_) => continue,
                        },
                    };
                    reply.add_answer(Record::from_rdata(name.clone(), TTL, rdata));
                }
            }
            Answer::Records(_) => {
                reply.add_authority(self.soa());
            }
            Answer::NxDomain | Answer::NotOurs => {
                reply.metadata.response_code = ResponseCode::NXDomain;
                reply.add_authority(self.soa());
            }
        }
        reply
    }

    /// The zone's SOA, which negative answers carry so resolvers can cache them.
    fn soa(&self) -> Record {
        let zone = Name::from_ascii(format!("{}.", self.zone.domain())).unwrap_or_else(|_| Name::root());
        let mname = Name::from_ascii(format!("ns.dns.{}.", self.zone.domain())).unwrap_or_else(|_| Name::root());
        let rname = Name::from_ascii(format!("hostmaster.{}.", self.zone.domain())).unwrap_or_else(|_| Name::root());
        Record::from_rdata(zone, TTL, RData::SOA(SOA::new(mname, rname, 1, 7200, 1800, 86400, TTL)))
    }

    /// Relays the query unchanged to the first upstream that answers; SERVFAIL if none does.
    async fn forward(&self, packet: &[u8], udp: bool) -> Option<Vec<u8>> {
        for upstream in &self.upstreams {
            let result = tokio::time::timeout(UPSTREAM_TIMEOUT, async {
                if udp { forward_udp(packet, *upstream).await } else { forward_tcp(packet, *upstream).await }
            })
            .await;
            match result {
                Ok(Ok(reply)) => return Some(reply),
                Ok(Err(e)) => tracing::debug!(%upstream, error = %e, "cluster DNS: upstream failed"),
                Err(_) => tracing::debug!(%upstream, "cluster DNS: upstream timed out"),
            }
        }
        let request = Message::from_vec(packet).ok()?;
        let mut reply = Message::error_msg(request.metadata.id, request.metadata.op_code, ResponseCode::ServFail);
        reply.metadata.recursion_desired = request.metadata.recursion_desired;
        reply.add_queries(request.queries);
        reply.to_vec().ok()
    }
}

async fn forward_udp(packet: &[u8], upstream: SocketAddr) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = if upstream.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().map_err(std::io::Error::other)?;
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(packet).await?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = socket.recv(&mut buf).await?;
        // Only a reply to this query's id counts; anything else on the socket is noise.
        if n >= 2 && buf[..2] == packet[..2] {
            return Ok(buf[..n].to_vec());
        }
    }
}

async fn forward_tcp(packet: &[u8], upstream: SocketAddr) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    let len = u16::try_from(packet.len()).map_err(std::io::Error::other)?;
    stream.write_u16(len).await?;
    stream.write_all(packet).await?;
    let len = stream.read_u16().await?;
    let mut reply = vec![0u8; usize::from(len)];
    stream.read_exact(&mut reply).await?;
    Ok(reply)
}

/// Starts the cluster DNS server of `shepherd server`/`standalone` if `--cluster-dns-listen` is set.
pub async fn start(
    args: &DnsArgs,
    manager: &Manager,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<(SocketAddr, tokio::task::JoinHandle<()>)>> {
    let Some(listen) = args.cluster_dns_listen else { return Ok(None) };
    let server = server(args, manager, listen)?;
    let (addr, task) = server.serve(listen, stop).await?;
    tracing::info!(%addr, domain = %args.cluster_domain, "cluster DNS serving");
    Ok(Some((addr, task)))
}

/// The DNS server of `args`, forwarding to the upstreams named (or /etc/resolv.conf's), never
/// to its own address `listen`.
fn server(args: &DnsArgs, manager: &Manager, listen: SocketAddr) -> anyhow::Result<Arc<DnsServer<CacheObjects>>> {
    let domain = args.cluster_domain.trim_matches('.');
    if domain.is_empty() || Name::from_ascii(format!("{domain}.")).is_err() {
        anyhow::bail!("--cluster-domain {:?} is not a DNS name", args.cluster_domain);
    }
    let upstreams = if args.dns_upstream.is_empty() {
        let text = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
        nameservers(&text)
    } else {
        args.dns_upstream.clone()
    };
    // Forwarding to ourselves would loop until every query timed out.
    let upstreams: Vec<SocketAddr> = upstreams.into_iter().filter(|u| *u != listen).collect();
    tracing::debug!(upstreams = ?upstreams, "cluster DNS upstreams");
    Ok(DnsServer::new(Zone::new(domain, CacheObjects::new(manager)), upstreams))
}

/// The cluster DNS of a node with a pod network, as a cluster add-on would be: served on port 53
/// of the pod bridge's address (the first of the node's podCIDR, which every pod routes to) once
/// the node has its podCIDR and the bridge is up, and named by the `kube-dns` Service, whose
/// ClusterIP pods are told. The domain is checked at once; the rest happens in the task.
pub fn start_on_pod_network(
    args: &DnsArgs,
    manager: &Manager,
    client: Arc<dyn Client>,
    node: String,
    service_range: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let server = server(args, manager, SocketAddr::from((Ipv4Addr::UNSPECIFIED, 53)))?;
    Ok(tokio::spawn(async move {
        let mut stopped = stop.clone();
        let stopping = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let serving = async {
            let gateway = loop {
                let node = client.get(&kinds::NODE, None, &node).await.ok();
                if let Some(ip) = node.as_ref().and_then(|n| first_host(str_at(n, "/spec/podCIDR"))) {
                    break ip;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let listen = SocketAddr::from((gateway, 53));
            let mut attempts = 0u32;
            let task = loop {
                // Refused until the agent has given the bridge its address.
                let mut stop = stop.clone();
                let stop = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                match server.clone().serve(listen, stop).await {
                    Ok((_, task)) => break task,
                    Err(e) => {
                        // The address is missing for a moment; anything lasting is said, once.
                        attempts += 1;
                        if attempts == 50 {
                            tracing::warn!(error = %e, "cluster DNS cannot listen yet; trying again");
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            };
            tracing::info!(addr = %listen, "cluster DNS serving on the pod network");
            publish_kube_dns(client.as_ref(), listen, &service_range, None).await;
            let _ = task.await;
        };
        tokio::select! {
            () = stopping => {}
            () = serving => {}
        }
    }))
}

/// [`ensure_kube_dns_service`], tried again a few times over two minutes: the API may refuse for
/// a moment (a store busy at start), the local node may not have registered yet.
pub async fn publish_kube_dns(client: &dyn Client, addr: SocketAddr, service_range: &str, node: Option<&str>) {
    for wait in [0u64, 1, 2, 5, 10, 30, 60] {
        tokio::time::sleep(Duration::from_secs(wait)).await;
        match ensure_kube_dns_service(client, addr, service_range, node).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "cannot write the kube-dns Service; retrying"),
        }
    }
}

/// Address `n` of an IPv4 CIDR (its network address plus `n`), for a prefix length in
/// `prefixes`: `10.244.0.0/24`, 1 → `10.244.0.1`.
fn nth_address(cidr: &str, n: u32, prefixes: std::ops::RangeInclusive<u32>) -> Option<Ipv4Addr> {
    let (ip, len) = cidr.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| prefixes.contains(l))?;
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    Some(Ipv4Addr::from((u32::from(ip) & mask) + n))
}

/// The first host address of an IPv4 CIDR: a pod bridge's own (`10.244.0.0/24` → `10.244.0.1`).
fn first_host(cidr: &str) -> Option<Ipv4Addr> {
    nth_address(cidr, 1, 1..=30)
}

/// The `kube-dns` Service's cluster IP: the tenth address of the Service range, as kubeadm picks
/// it, so agents can be told it (`--cluster-dns`) before the Service exists.
pub fn kube_dns_cluster_ip(service_range: &str) -> Option<Ipv4Addr> {
    nth_address(service_range, 10, 0..=28)
}

/// The `kube-dns` Service and its Endpoints in kube-system, naming the DNS server at `addr`
/// (how Kubernetes exposes CoreDNS): created if absent, their ports and address kept current.
/// A server listening on every address (`0.0.0.0`) is named by the InternalIP of `node`, the
/// local node it serves beside (a NotFound until that node has registered); without one it names
/// no endpoint.
pub async fn ensure_kube_dns_service(
    client: &dyn Client,
    addr: SocketAddr,
    service_range: &str,
    node: Option<&str>,
) -> Result<(), shepherd_api::ApiError> {
    let addr = match (addr.ip().is_unspecified(), node) {
        (true, Some(node)) => {
            let node = client.get(&kinds::NODE, None, node).await?;
            let internal = node.at("/status/addresses").and_then(Value::as_array).into_iter().flatten().find(|a| a["type"] == "InternalIP");
            match internal.and_then(|a| a["address"].as_str()).and_then(|ip| ip.parse::<std::net::IpAddr>().ok()) {
                Some(ip) => SocketAddr::new(ip, addr.port()),
                None => return Err(shepherd_api::ApiError::not_found("nodes", &format!("{} with an InternalIP", str_at(&node, "/metadata/name")))),
            }
        }
        _ => addr,
    };
    const NS: &str = "kube-system";
    const NAME: &str = "kube-dns";
    let labels = json!({"k8s-app": "kube-dns", "kubernetes.io/name": "KubeDNS"});
    let ports = json!([
        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": addr.port()},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": addr.port()},
    ]);
    match client.get(&kinds::SERVICE, Some(NS), NAME).await {
        Ok(mut svc) => {
            if svc.at("/spec/ports") != Some(&ports) {
                svc["spec"]["ports"] = ports;
                client.update(&kinds::SERVICE, Some(NS), svc).await?;
            }
        }
        Err(e) if e.is_not_found() => {
            let mut spec = json!({"ports": ports});
            // Only an address no other Service holds; else the allocator picks one.
            if let Some(ip) = kube_dns_cluster_ip(service_range) {
                let services = client.list(&kinds::SERVICE, &ListParams::default()).await?;
                let ip = ip.to_string();
                if !services.items.iter().any(|s| s.at("/spec/clusterIP").and_then(Value::as_str) == Some(ip.as_str())) {
                    spec["clusterIP"] = json!(ip);
                    spec["clusterIPs"] = json!([ip]);
                }
            }
            let svc = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": NAME, "namespace": NS, "labels": labels}, "spec": spec});
            client.create(&kinds::SERVICE, Some(NS), svc).await?;
        }
        Err(e) => return Err(e),
    }
    // An unspecified listen address (0.0.0.0) names no endpoint a client could reach.
    let subsets = if addr.ip().is_unspecified() {
        json!([])
    } else {
        json!([{"addresses": [{"ip": addr.ip().to_string()}], "ports": [
            {"name": "dns", "port": addr.port(), "protocol": "UDP"},
            {"name": "dns-tcp", "port": addr.port(), "protocol": "TCP"}]}])
    };
    match client.get(&kinds::ENDPOINTS, Some(NS), NAME).await {
        Ok(mut ep) => {
            if ep.at("/subsets") != Some(&subsets) {
                ep["subsets"] = subsets;
                client.update(&kinds::ENDPOINTS, Some(NS), ep).await?;
            }
        }
        Err(e) if e.is_not_found() => {
            let ep = json!({"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": NAME, "namespace": NS, "labels": labels}, "subsets": subsets});
            client.create(&kinds::ENDPOINTS, Some(NS), ep).await?;
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Fake {
        services: BTreeMap<String, Arc<Value>>,
        endpoints: BTreeMap<String, Arc<Value>>,
    }

    impl Objects for Fake {
        fn service(&self, ns: &str, name: &str) -> Option<Arc<Value>> {
            self.services.get(&format!("{ns}/{name}")).cloned()
        }
        fn endpoints(&self, ns: &str, name: &str) -> Option<Arc<Value>> {
            self.endpoints.get(&format!("{ns}/{name}")).cloned()
        }
        fn namespace_has_services(&self, ns: &str) -> bool {
            self.services.keys().any(|k| k.starts_with(&format!("{ns}/")))
        }
    }

    fn zone() -> Zone<Fake> {
        let mut f = Fake::default();
        f.services.insert(
            "default/web".into(),
            Arc::new(json!({"spec": {"clusterIP": "10.96.0.20", "ports": [
                {"name": "http", "port": 80, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}})),
        );
        f.services.insert(
            "db/pg".into(),
            Arc::new(json!({"spec": {"clusterIP": "None", "ports": [{"name": "sql", "port": 5432}]}})),
        );
        f.endpoints.insert(
            "db/pg".into(),
            Arc::new(json!({"subsets": [{
                "addresses": [{"ip": "10.244.1.7"}, {"ip": "10.244.0.3", "hostname": "pg-0"}],
                "notReadyAddresses": [{"ip": "10.244.0.9"}],
                "ports": [{"name": "sql", "port": 15432}]}]})),
        );
        Zone::new("cluster.local", f)
    }

    fn a(ips: &[&str]) -> Answer {
        Answer::Records(ips.iter().map(|ip| Rec::A(ip.parse().unwrap())).collect())
    }

    #[test]
    fn a_service_name_answers_with_its_cluster_ip_in_any_case_with_or_without_the_final_dot() {
        let z = zone();
        assert_eq!(z.answer("web.default.svc.cluster.local.", RecordType::A), a(&["10.96.0.20"]));
        assert_eq!(z.answer("WEB.Default.svc.cluster.local", RecordType::A), a(&["10.96.0.20"]));
    }

    #[test]
    fn a_headless_service_answers_with_its_ready_endpoints_only() {
        let z = zone();
        assert_eq!(z.answer("pg.db.svc.cluster.local.", RecordType::A), a(&["10.244.0.3", "10.244.1.7"]));
        assert_eq!(z.answer("pg-0.pg.db.svc.cluster.local.", RecordType::A), a(&["10.244.0.3"]));
        assert_eq!(z.answer("10-244-1-7.pg.db.svc.cluster.local.", RecordType::A), a(&["10.244.1.7"]));
        assert_eq!(z.answer("10-244-0-9.pg.db.svc.cluster.local.", RecordType::A), Answer::NxDomain);
    }

    #[test]
    fn srv_names_a_named_port_by_protocol() {
        let z = zone();
        assert_eq!(
            z.answer("_http._tcp.web.default.svc.cluster.local.", RecordType::SRV),
            Answer::Records(vec![Rec::Srv(0, 100, 80, "web.default.svc.cluster.local".into())])
        );
        assert_eq!(
            z.answer("_dns._udp.web.default.svc.cluster.local.", RecordType::SRV),
            Answer::Records(vec![Rec::Srv(0, 100, 53, "web.default.svc.cluster.local".into())])
        );
        assert_eq!(z.answer("_http._udp.web.default.svc.cluster.local.", RecordType::SRV), Answer::NxDomain);
        assert_eq!(z.answer("_nope._tcp.web.default.svc.cluster.local.", RecordType::SRV), Answer::NxDomain);
    }

    #[test]
    fn srv_of_a_headless_service_names_each_ready_endpoint_and_its_target_port() {
        let z = zone();
        assert_eq!(
            z.answer("_sql._tcp.pg.db.svc.cluster.local.", RecordType::SRV),
            Answer::Records(vec![
                Rec::Srv(0, 50, 15432, "pg-0.pg.db.svc.cluster.local".into()),
                Rec::Srv(0, 50, 15432, "10-244-1-7.pg.db.svc.cluster.local".into()),
            ])
        );
    }

    #[test]
    fn names_that_do_not_exist_in_the_cluster_domain_are_nxdomain() {
        let z = zone();
        for name in ["nope.default.svc.cluster.local", "web.other.svc.cluster.local", "other.svc.cluster.local",
            "a.b.c.d.e.f.svc.cluster.local", "x.cluster.local", "web.default.pod.cluster.local"] {
            assert_eq!(z.answer(name, RecordType::A), Answer::NxDomain, "{name}");
        }
    }

    #[test]
    fn an_existing_name_of_another_type_is_nodata_not_nxdomain() {
        let z = zone();
        assert_eq!(z.answer("web.default.svc.cluster.local", RecordType::AAAA), Answer::Records(vec![]));
        assert_eq!(z.answer("default.svc.cluster.local", RecordType::A), Answer::Records(vec![]));
        assert_eq!(z.answer("cluster.local", RecordType::SOA), Answer::Records(vec![]));
    }

    #[test]
    fn pod_names_answer_with_the_dashed_address() {
        let z = zone();
        assert_eq!(z.answer("10-244-2-9.default.pod.cluster.local", RecordType::A), a(&["10.244.2.9"]));
        assert_eq!(z.answer("10-244-2.default.pod.cluster.local", RecordType::A), Answer::NxDomain);
    }

    #[test]
    fn names_outside_the_domain_are_not_ours_even_when_they_end_alike() {
        let z = zone();
        assert_eq!(z.answer("example.com.", RecordType::A), Answer::NotOurs);
        assert_eq!(z.answer("web.default.svc.notcluster.local.", RecordType::A), Answer::NotOurs);
    }

    #[test]
    fn kube_dns_takes_the_tenth_address_of_the_service_range() {
        assert_eq!(kube_dns_cluster_ip("10.96.0.0/16"), Some("10.96.0.10".parse().unwrap()));
        assert_eq!(kube_dns_cluster_ip("10.96.7.3/24"), Some("10.96.7.10".parse().unwrap()));
        assert_eq!(kube_dns_cluster_ip("10.96.0.0/30"), None);
        assert_eq!(kube_dns_cluster_ip("bogus"), None);
    }

    #[test]
    fn nameservers_are_read_from_resolv_conf() {
        let text = "# generated\nsearch example\nnameserver 192.0.2.1\nnameserver  2001:db8::1\nnameserver bogus\n";
        assert_eq!(nameservers(text), vec!["192.0.2.1:53".parse().unwrap(), "[2001:db8::1]:53".parse().unwrap()]);
    }

    #[tokio::test]
    async fn a_malformed_packet_gets_no_reply_and_a_good_one_after_it_does() {
        let server = DnsServer::new(zone(), vec![]);
        assert_eq!(server.handle(&[0x12, 0x34, 0xff, 0x00, 0x01], true).await, None);
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii("web.default.svc.cluster.local.").unwrap(), RecordType::A));
        let reply = server.handle(&q.to_vec().unwrap(), true).await.expect("a reply");
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!(reply.metadata.id, q.metadata.id);
        assert_eq!(reply.answers.len(), 1);
        assert_eq!(reply.answers[0].data, RData::A(A("10.96.0.20".parse().unwrap())));
    }
}
