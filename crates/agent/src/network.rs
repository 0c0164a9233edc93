//! Pod networks on a node (`--pod-network bridge`): each pod gets a network namespace of its own,
//! joined by a veth pair to the node's bridge, with an address from the node's podCIDR and a
//! default route via the bridge; other nodes' pod CIDRs are routed via their InternalIPs.
//!
//! All of it happens in the agent's network namespace (the node's: the agent turns on forwarding
//! and adds a bridge, routes and a masquerading nftables table there, as a CNI bridge plugin
//! does) and in the pods' namespaces, through netlink. The Service range is routed to the bridge,
//! so the node's own connections to ClusterIPs leave from the bridge's address and reach pods
//! after the Service rules' DNAT; pods' traffic to anywhere outside the cluster's pod range leaves
//! masqueraded as the node. A pod's namespace is pinned by a bind mount under the agent's data dir, like
//! the oci sandbox's IPC and UTS namespaces, so it outlives the agent; its address is reserved on
//! disk (`network_ipam`). A pod is set up once: a marker file written last says it is complete,
//! so an agent killed half-way redoes the pod's setup instead of trusting it.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures::TryStreamExt;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol, RouteScope};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth, RouteMessageBuilder};
use serde_json::Value;
use shepherd_api::{JsonPath, kinds};
use shepherd_runtime::Client;

use crate::network_ipam::{Cidr, Ipam, IpamError};

/// The node's bridge, which the pods' veth pairs join; it holds the podCIDR's first address.
pub const BRIDGE: &str = "shep0";
/// The pod side of its veth pair, as pods see it.
const POD_INTERFACE: &str = "eth0";
/// Marks the routes to other nodes' pod CIDRs as this agent's, so stale ones can be told apart
/// from routes someone else added.
const ROUTE_PROTOCOL: u8 = 0x53;
/// The nftables table that masquerades pods' traffic leaving the cluster's pod range.
pub const MASQUERADE_TABLE: &str = "shepherd-pods";

/// The cluster's address ranges a node's pod network needs to know.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Ranges {
    /// Routed to the bridge, so the node reaches ClusterIPs.
    pub services: Option<Cidr>,
    /// Pods' traffic to addresses outside it is masqueraded.
    pub cluster: Option<Cidr>,
}

impl Ranges {
    pub fn parse(config: &crate::AgentConfig) -> Result<Ranges, crate::AgentError> {
        let parse = |what: &str, v: &Option<String>| -> Result<Option<Cidr>, crate::AgentError> {
            v.as_deref()
                .map(|text| text.parse::<Cidr>().map_err(|why| crate::AgentError::Network(format!("{what} {why}"))))
                .transpose()
        };
        Ok(Ranges { services: parse("the Service range", &config.service_cidr)?, cluster: parse("the cluster CIDR", &config.cluster_cidr)? })
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NetworkError {
    #[error("cannot write the nftables table {MASQUERADE_TABLE} (pods' traffic out of the cluster): {0}")]
    Masquerade(String),
    #[error("node {0} has no spec.podCIDR yet (the nodeipam controller of the server assigns one)")]
    NoPodCidr(String),
    #[error("node {node} has an unusable spec.podCIDR: {why}")]
    BadPodCidr { node: String, why: String },
    #[error("{what}: {source}")]
    Netlink { what: String, source: rtnetlink::Error },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error(transparent)]
    Ipam(#[from] IpamError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> NetworkError {
    let what = what.into();
    move |source| NetworkError::Io { what, source }
}

fn nl_err(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetworkError {
    let what = what.into();
    move |source| NetworkError::Netlink { what, source }
}

fn path_safe(uid: &str) -> String {
    uid.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect()
}

/// Where the network namespace of pod `uid` is pinned.
pub(crate) fn netns_path(data_dir: &Path, uid: &str) -> PathBuf {
    data_dir.join("network/netns").join(path_safe(uid))
}

/// The pod's network namespace, if the agent made one (a `hostNetwork` pod, or any pod with
/// `--pod-network host`, has none and runs in the node's).
pub(crate) fn netns_of(data_dir: &Path, uid: &str) -> Option<PathBuf> {
    let p = netns_path(data_dir, uid);
    is_mounted(&p).then_some(p)
}

/// A file with a bind mount on it lives on another device (or is another inode) than before.
fn is_mounted(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs::metadata(path), path.parent()) else { return false };
    // An nsfs inode sits on the nsfs device, never on the directory's.
    fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev())
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::other("path contains a NUL byte"))
}

/// The host side of pod `uid`'s veth pair (at most 15 bytes, unique per uid).
fn host_interface(uid: &str) -> String {
    let hex: String = uid.chars().filter(char::is_ascii_alphanumeric).take(11).collect();
    format!("veth{hex}")
}

/// Makes a new network namespace and pins it at `path`. A thread of its own unshares (the
/// network namespace is per thread), binds and ends, leaving the agent's threads where they were.
fn create_netns(path: &Path) -> Result<(), NetworkError> {
    let what = format!("creating the pod network namespace {}", path.display());
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(io_err(what.clone()))?;
    }
    fs::write(path, b"").map_err(io_err(what.clone()))?;
    let target = c_path(path).map_err(io_err(what.clone()))?;
    std::thread::spawn(move || -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated strings that live until the calls return.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            let source = CString::new(format!("/proc/self/task/{}/ns/net", libc::gettid())).map_err(io::Error::other)?;
            if libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    })
    .join()
    .map_err(|_| NetworkError::Io { what: what.clone(), source: io::Error::other("the namespace thread panicked") })?
    .map_err(io_err(what))
}

fn remove_netns(path: &Path) {
    if let Ok(c) = c_path(path) {
        // SAFETY: umount2 on a NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = fs::remove_file(path);
}

/// Runs `f` with a netlink handle inside the namespace pinned at `netns`, on a thread of its own
/// (a netlink socket belongs to the namespace it was opened in).
fn in_netns<F, Fut>(netns: &Path, f: F) -> Result<(), NetworkError>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), NetworkError>>,
{
    let what = format!("entering the pod network namespace {}", netns.display());
    let file = fs::File::open(netns).map_err(io_err(what.clone()))?;
    std::thread::spawn(move || -> Result<(), NetworkError> {
        // SAFETY: setns on a descriptor we own; it changes only this thread's namespace.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(NetworkError::Io { what, source: io::Error::last_os_error() });
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(io_err("a runtime for netlink"))?;
        rt.block_on(async move {
            let (connection, handle, _) = rtnetlink::new_connection().map_err(io_err("opening netlink in the pod namespace"))?;
            let conn = tokio::spawn(connection);
            let result = f(handle).await;
            conn.abort();
            result
        })
    })
    .join()
    .map_err(|_| NetworkError::Io { what: "configuring the pod network".into(), source: io::Error::other("the thread panicked") })?
}

/// Runs `f`, which waits on a thread of its own, off the async workers.
async fn blocking(f: impl FnOnce() -> Result<(), NetworkError> + Send + 'static) -> Result<(), NetworkError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| NetworkError::Io { what: "configuring the pod network".into(), source: io::Error::other(e.to_string()) })?
}

async fn link_index(handle: &Handle, name: &str) -> Result<Option<u32>, NetworkError> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(link)) => Ok(Some(link.header.index)),
        Ok(None) => Ok(None),
        // The kernel answers "no such device" for a name it does not know.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(nl_err(format!("looking up interface {name}"))(e)),
    }
}

/// What the node's network needs once: its podCIDR, known after the bridge is set up.
struct NodeNet {
    cidr: Cidr,
    ipam: Ipam,
}

/// The pod networks of one node.
pub(crate) struct PodNetwork {
    data_dir: PathBuf,
    node_name: String,
    client: Arc<dyn Client>,
    handle: Handle,
    ranges: Ranges,
    node: tokio::sync::Mutex<Option<Arc<NodeNet>>>,
    /// Pod uids whose setup is complete, so a reconcile of a running pod costs no system call.
    ready: Mutex<HashSet<String>>,
}

impl PodNetwork {
    /// Opens netlink in the agent's namespace. Needs a Tokio runtime.
    pub fn new(data_dir: &Path, node_name: &str, client: Arc<dyn Client>, ranges: Ranges) -> Result<PodNetwork, NetworkError> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(io_err("opening a netlink socket"))?;
        tokio::spawn(connection);
        Ok(PodNetwork {
            data_dir: data_dir.to_path_buf(),
            node_name: node_name.to_string(),
            client,
            handle,
            ranges,
            node: tokio::sync::Mutex::default(),
            ready: Mutex::default(),
        })
    }

    fn dir(&self) -> PathBuf {
        self.data_dir.join("network")
    }

    fn marker(&self, uid: &str) -> PathBuf {
        self.dir().join("ready").join(path_safe(uid))
    }

    /// The node's podCIDR and bridge, set up on first use.
    async fn node_net(&self) -> Result<Arc<NodeNet>, NetworkError> {
        let mut node = self.node.lock().await;
        if let Some(n) = &*node {
            return Ok(n.clone());
        }
        let obj = self.client.get(&kinds::NODE, None, &self.node_name).await.map_err(|e| {
            // A node not registered yet has no podCIDR yet either.
            if e.is_not_found() {
                return NetworkError::NoPodCidr(self.node_name.clone());
            }
            NetworkError::Io { what: format!("reading node {}", self.node_name), source: io::Error::other(e.to_string()) }
        })?;
        let cidr_text = obj.at("/spec/podCIDR").and_then(Value::as_str).unwrap_or("");
        if cidr_text.is_empty() {
            return Err(NetworkError::NoPodCidr(self.node_name.clone()));
        }
        let cidr: Cidr = cidr_text.parse().map_err(|why| NetworkError::BadPodCidr { node: self.node_name.clone(), why })?;
        self.ensure_bridge(cidr).await?;
        let ipam = Ipam::open(&self.dir().join("ipam"), cidr)?;
        let n = Arc::new(NodeNet { cidr, ipam });
        *node = Some(n.clone());
        Ok(n)
    }

    async fn ensure_bridge(&self, cidr: Cidr) -> Result<(), NetworkError> {
        let links = self.handle.link();
        if link_index(&self.handle, BRIDGE).await?.is_none() {
            links.add(LinkBridge::new(BRIDGE).build()).execute().await.map_err(nl_err(format!("creating bridge {BRIDGE}")))?;
        }
        let index = link_index(&self.handle, BRIDGE).await?.ok_or_else(|| NetworkError::Io {
            what: format!("bridge {BRIDGE}"),
            source: io::Error::other("missing right after it was created"),
        })?;
        self.handle
            .address()
            .add(index, IpAddr::V4(cidr.gateway()), cidr.prefix)
            .replace()
            .execute()
            .await
            .map_err(nl_err(format!("giving bridge {BRIDGE} the address {}", cidr.gateway())))?;
        links.set(LinkUnspec::new_with_index(index).up().build()).execute().await.map_err(nl_err(format!("bringing {BRIDGE} up")))?;
        // Pods on other nodes are reached through this namespace.
        fs::write("/proc/sys/net/ipv4/ip_forward", b"1").map_err(io_err("turning on IPv4 forwarding in the node's namespace"))?;
        if let Some(services) = self.ranges.services {
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(services.network, services.prefix)
                .output_interface(index)
                .pref_source(cidr.gateway())
                .scope(RouteScope::Link)
                .build();
            self.handle
                .route()
                .add(route)
                .replace()
                .execute()
                .await
                .map_err(nl_err(format!("routing the Service range {services} to {BRIDGE}")))?;
        }
        if let Some(cluster) = self.ranges.cluster {
            let t = MASQUERADE_TABLE;
            let script = format!(
                "add table ip {t}\ndelete table ip {t}\nadd table ip {t}\n\
                 add chain ip {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
                 add rule ip {t} postrouting ip saddr {cidr} ip daddr != {cluster} masquerade\n"
            );
            crate::proxy::apply(&script).map_err(|e| NetworkError::Masquerade(e.to_string()))?;
        }
        Ok(())
    }

    /// Sets up the node's bridge as soon as the node has its podCIDR, trying again until it can.
    pub async fn wait_ready(&self) {
        let mut wait = std::time::Duration::from_millis(100);
        loop {
            match self.node_net().await {
                Ok(n) => {
                    tracing::info!(pod_cidr = %n.cidr, bridge = BRIDGE, "pod network ready");
                    return;
                }
                // Expected for a moment: the server's nodeipam controller assigns it.
                Err(NetworkError::NoPodCidr(_)) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot set up the node's pod network yet; trying again");
                    wait = (wait * 2).min(std::time::Duration::from_secs(5));
                }
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Lets go of every pod's network namespace and link, keeping the addresses reserved: for a
    /// node stopping with its pods, whose next start gives each pod its address again.
    pub async fn release_namespaces(&self) {
        // Every pod set up (the ready ones among them) has its namespace pinned in this directory.
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let dir = self.data_dir.join("network/netns");
        let pinned: Vec<String> =
            fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        for uid in pinned {
            let _ = fs::remove_file(self.marker(&uid));
            self.remove_links(&uid).await;
            remove_netns(&netns_path(&self.data_dir, &uid));
        }
    }

    /// Gives pod `uid` its namespace, veth pair, address and default route (idempotent); returns
    /// its address and the namespace's path.
    pub async fn setup(&self, uid: &str) -> Result<(Ipv4Addr, PathBuf), NetworkError> {
        let node = self.node_net().await?;
        let ip = node.ipam.reserve(uid)?;
        let netns = netns_path(&self.data_dir, uid);
        let marker = self.marker(uid);
        if self.ready.lock().unwrap_or_else(|e| e.into_inner()).contains(uid) || (marker.exists() && is_mounted(&netns)) {
            self.ready.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string());
            return Ok((ip, netns));
        }
        let started = std::time::Instant::now();
        // Whatever an earlier, unfinished attempt left goes first; no container runs in it yet.
        self.remove_links(uid).await;
        remove_netns(&netns);
        let pinned = netns.clone();
        blocking(move || create_netns(&pinned)).await?;

        let host = host_interface(uid);
        let peer = format!("p{}", &host[4..]);
        let links = self.handle.link();
        links
            .add(LinkVeth::new(&host, &peer).build())
            .execute()
            .await
            .map_err(nl_err(format!("creating the veth pair {host} for pod {uid}")))?;
        let missing = |name: &str| NetworkError::Io { what: format!("interface {name}"), source: io::Error::other("missing after creation") };
        let host_index = link_index(&self.handle, &host).await?.ok_or_else(|| missing(&host))?;
        let peer_index = link_index(&self.handle, &peer).await?.ok_or_else(|| missing(&peer))?;
        let bridge = link_index(&self.handle, BRIDGE).await?.ok_or_else(|| missing(BRIDGE))?;
        links
            .set(LinkUnspec::new_with_index(host_index).controller(bridge).up().build())
            .execute()
            .await
            .map_err(nl_err(format!("joining {host} to {BRIDGE}")))?;
        // A pod reaching itself through a Service: the DNATed packet goes back out the port it
        // came in by, which a bridge refuses unless the port is in hairpin mode.
        links
            .set_port(LinkBridgePort::new(host_index).hairpin(true).build())
            .execute()
            .await
            .map_err(nl_err(format!("setting hairpin mode on {host}")))?;
        let ns_file = fs::File::open(&netns).map_err(io_err(format!("opening {}", netns.display())))?;
        links
            .set(LinkUnspec::new_with_index(peer_index).setns_by_fd(ns_file.as_raw_fd()).build())
            .execute()
            .await
            .map_err(nl_err(format!("moving {peer} into the pod's namespace")))?;
        drop(ns_file);

        let (prefix, gateway) = (node.cidr.prefix, node.cidr.gateway());
        let inside = netns.clone();
        blocking(move || in_netns(&inside, move |h| async move {
            let index = link_index(&h, &peer).await?.ok_or_else(|| missing(&peer))?;
            h.link()
                .set(LinkUnspec::new_with_index(index).name(POD_INTERFACE.to_string()).up().build())
                .execute()
                .await
                .map_err(nl_err(format!("naming the pod's interface {POD_INTERFACE}")))?;
            h.address()
                .add(index, IpAddr::V4(ip), prefix)
                .replace()
                .execute()
                .await
                .map_err(nl_err(format!("giving the pod its address {ip}")))?;
            let lo = link_index(&h, "lo").await?.ok_or_else(|| missing("lo"))?;
            h.link().set(LinkUnspec::new_with_index(lo).up().build()).execute().await.map_err(nl_err("bringing lo up"))?;
            let route = RouteMessageBuilder::<Ipv4Addr>::new().gateway(gateway).output_interface(index).build();
            h.route().add(route).replace().execute().await.map_err(nl_err(format!("adding the default route via {gateway}")))?;
            Ok(())
        }))
        .await?;
        if let Some(dir) = marker.parent() {
            fs::create_dir_all(dir).map_err(io_err("the network marker directory"))?;
        }
        fs::write(&marker, ip.to_string()).map_err(io_err(format!("writing {}", marker.display())))?;
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string());
        tracing::info!(pod_uid = uid, %ip, setup_ms = started.elapsed().as_secs_f64() * 1e3, "pod network set up");
        Ok((ip, netns))
    }

    async fn remove_links(&self, uid: &str) {
        if let Ok(Some(index)) = link_index(&self.handle, &host_interface(uid)).await {
            let _ = self.handle.link().del(index).execute().await;
        }
    }

    /// Removes pod `uid`'s network and frees its address. Its containers must have ended.
    pub async fn teardown(&self, uid: &str) {
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
        let _ = fs::remove_file(self.marker(uid));
        self.remove_links(uid).await;
        remove_netns(&netns_path(&self.data_dir, uid));
        if let Ok(node) = self.node_net().await {
            node.ipam.release(uid);
        }
    }

    /// Tears down the networks of pods that are gone although no reconcile saw them go (deleted
    /// while no agent ran and never adopted, such as a pod whose containers never started).
    /// `live` is asked after the reservations are read: a pod reserves only once it is known, so
    /// every reservation read belongs to a pod `live` then names, unless that pod is gone.
    pub async fn release_stale(&self, live: impl FnOnce() -> HashSet<String>) {
        let Ok(node) = self.node_net().await else { return };
        let reservations = node.ipam.reservations();
        let live = live();
        for (ip, uid) in reservations {
            if !live.contains(&uid) {
                tracing::info!(pod_uid = %uid, %ip, "releasing the address of a pod that is gone");
                self.teardown(&uid).await;
            }
        }
    }

    /// Routes every other node's podCIDR via its InternalIP, and removes routes this agent added
    /// earlier for nodes that are gone or moved.
    pub async fn sync_routes(&self, nodes: &[Arc<Value>]) -> Result<(), NetworkError> {
        let mut desired: Vec<(Cidr, Ipv4Addr)> = Vec::new();
        for n in nodes {
            if n.at("/metadata/name").and_then(Value::as_str) == Some(self.node_name.as_str()) {
                continue;
            }
            let Some(cidr) = n.at("/spec/podCIDR").and_then(Value::as_str).and_then(|c| c.parse::<Cidr>().ok()) else { continue };
            let internal = n
                .at("/status/addresses")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().find(|a| a.at("/type").and_then(Value::as_str) == Some("InternalIP")))
                .and_then(|a| a.at("/address").and_then(Value::as_str))
                .and_then(|a| a.parse::<Ipv4Addr>().ok());
            if let Some(via) = internal {
                desired.push((cidr, via));
            }
        }
        for (cidr, via) in &desired {
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(cidr.network, cidr.prefix)
                .gateway(*via)
                .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
                .build();
            if let Err(e) = self.handle.route().add(route).replace().execute().await {
                // A node whose address is not reachable from here yet: the next sync tries again.
                tracing::warn!(pod_cidr = %cidr, via = %via, error = %e, "cannot route another node's pod CIDR");
            }
        }
        let routes: Vec<_> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(nl_err("listing routes"))?;
        for r in routes {
            if r.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
                continue;
            }
            let dest = r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
                _ => None,
            });
            let gw = r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
                _ => None,
            });
            let wanted = desired.iter().any(|(c, via)| {
                Some(c.network) == dest && c.prefix == r.header.destination_prefix_length && Some(*via) == gw
            });
            if !wanted {
                let _ = self.handle.route().del(r).execute().await;
            }
        }
        Ok(())
    }
}
