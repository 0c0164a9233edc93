//! Pod networks end to end, on real binaries: `shepherd server` and two `shepherd agent
//! --pod-network bridge`, each in a network namespace of its own, joined by an underlay bridge in
//! another one. Every namespace, link, address and route is made by the test inside namespaces it
//! created; the machine's own network namespace is never touched and no other address is a target.
//! Needs root and iproute2 (`ip netns`), nsenter and curl.

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Daemon, Netns};
use serde_json::{Value, json};

/// The underlay's addresses: the server's, then one per node.
/// The administrator token the server takes (`--token`) and the agents and curl present.
const TOKEN: &str = "network-test-token";
const SERVER_IP: &str = "172.31.250.1";
const NODE_IPS: [&str; 2] = ["172.31.250.11", "172.31.250.12"];

fn require_root_and_tools() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "tests/network.rs needs root (network namespaces, bridges, veth pairs)");
    for tool in ["ip", "nsenter", "curl"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
        assert!(found, "tests/network.rs needs `{tool}` (packages iproute2, util-linux, curl)");
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run command");
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// An agent process; dropping it kills it and the containers it left: the shims, which name its
/// data directory in their command line (a restarted agent shares it: only the last one of a node
/// sweeps).
struct Agent {
    child: Child,
    cmdline: Vec<u8>,
    data_dir: PathBuf,
}

impl Agent {
    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
        // An agent replaced by a restart has its command line cleared: its containers are the
        // new agent's now.
        if !self.cmdline.is_empty() {
            common::kill_leftovers(&self.cmdline, Some(&self.data_dir));
        }
    }
}

/// The server, its nodes and the underlay joining them.
struct Cluster {
    dir: tempfile::TempDir,
    /// The agents' `--runtime`.
    runtime: &'static str,
    /// Further flags of every agent.
    agent_flags: &'static [&'static str],
    server: Option<Daemon>,
    agents: Vec<Option<Agent>>,
    nodes: Vec<Netns>,
    server_ns: Netns,
    _underlay: Netns,
}

impl Cluster {
    /// A server and `nodes` agents on the process runtime; `server_flags` are extra server flags.
    fn start(tag: &str, nodes: usize, server_flags: &[&str]) -> Cluster {
        Cluster::start_on("process", tag, nodes, server_flags)
    }

    fn start_on(runtime: &'static str, tag: &str, nodes: usize, server_flags: &[&str]) -> Cluster {
        Cluster::start_with(runtime, tag, nodes, server_flags, &[])
    }

    fn start_with(
        runtime: &'static str,
        tag: &str,
        nodes: usize,
        server_flags: &[&str],
        agent_flags: &'static [&'static str],
    ) -> Cluster {
        require_root_and_tools();
        let prefix = format!("shp{}{tag}", std::process::id() % 100_000);
        let underlay = Netns::new(format!("{prefix}u"));
        underlay.ip(&["link", "add", "underlay", "type", "bridge"]);
        underlay.ip(&["link", "set", "underlay", "up"]);
        let join = |ns: &Netns, i: usize, address: &str| {
            let port = format!("port{i}");
            underlay.ip(&["link", "add", &port, "type", "veth", "peer", "name", "ul", "netns", &ns.0]);
            underlay.ip(&["link", "set", &port, "master", "underlay", "up"]);
            ns.ip(&["addr", "add", &format!("{address}/24"), "dev", "ul"]);
            ns.ip(&["link", "set", "ul", "up"]);
        };
        let server_ns = Netns::new(format!("{prefix}s"));
        join(&server_ns, 0, SERVER_IP);
        let node_ns: Vec<Netns> = (0..nodes).map(|i| Netns::new(format!("{prefix}n{i}"))).collect();
        for (i, ns) in node_ns.iter().enumerate() {
            join(ns, i + 1, NODE_IPS[i]);
        }

        let dir = tempfile::tempdir().expect("tempdir");
        let child = server_ns
            .command(env!("CARGO_BIN_EXE_shepherd"))
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path().join("server"))
            .args(["--listen", &format!("{SERVER_IP}:0"), "--token", TOKEN])
            .args(server_flags)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shepherd server");
        let server = Daemon::from_child(child);
        let mut cluster =
            Cluster { dir, runtime, agent_flags, server: Some(server), agents: Vec::new(), nodes: node_ns, server_ns, _underlay: underlay };
        for i in 0..nodes {
            let agent = cluster.start_agent(i);
            cluster.agents.push(Some(agent));
        }
        for i in 0..nodes {
            cluster.wait_for(&format!("node-{i} to register with a podCIDR"), 60, |c| {
                c.get(&format!("/api/v1/nodes/node-{i}"))["spec"]["podCIDR"].as_str().map(str::to_string)
            });
        }
        cluster
    }

    fn url(&self) -> String {
        self.server.as_ref().map(|s| s.url.clone()).unwrap_or_default()
    }

    /// The cluster CA, which signed the server's certificate: the server is off loopback, so TLS.
    fn ca(&self) -> PathBuf {
        self.dir.path().join("server/pki/ca.crt")
    }

    fn agent_dir(&self, node: usize) -> PathBuf {
        self.dir.path().join(format!("agent-{node}"))
    }

    fn start_agent(&self, node: usize) -> Agent {
        let child = self.nodes[node]
            .command(env!("CARGO_BIN_EXE_shepherd"))
            .args(["agent", "--server", &self.url(), "--node-name", &format!("node-{node}"), "--node-ip", NODE_IPS[node]])
            .args(["--token", TOKEN, "--certificate-authority"])
            .arg(self.ca())
            .args(["--runtime", self.runtime, "--pod-network", "bridge", "--lease-seconds", "1", "--data-dir"])
            .arg(self.agent_dir(node))
            .args(self.agent_flags)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(self.log_file(node))
            .spawn()
            .expect("start shepherd agent");
        // nsenter execs the agent: wait until /proc shows the agent's own command line.
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let cmdline = loop {
            let c = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if c.starts_with(env!("CARGO_BIN_EXE_shepherd").as_bytes()) {
                break c;
            }
            assert!(Instant::now() < deadline, "the agent of node-{node} did not start: {:?}", String::from_utf8_lossy(&c));
            std::thread::sleep(Duration::from_millis(10));
        };
        Agent { child, cmdline, data_dir: self.agent_dir(node) }
    }

    /// Where agent `node`'s log goes (appended across restarts), shown when a wait times out.
    fn log_file(&self, node: usize) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("agent-{node}.log")))
            .expect("agent log file")
    }

    fn agent_logs(&self) -> String {
        (0..self.nodes.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.path().join(format!("agent-{i}.log"))).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                format!("--- agent of node-{i}, last lines:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// GET `path` from the server (from inside the server's namespace).
    fn get(&self, path: &str) -> Value {
        let out = self
            .server_ns
            .command("curl")
            .args(["-s", "-m", "10", "-H", &format!("Authorization: Bearer {TOKEN}"), "--cacert"])
            .arg(self.ca())
            .arg(format!("{}{path}", self.url()))
            .output()
            .expect("curl");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut cmd = self.server_ns.command(common::installed_kubectl());
        cmd.arg("--kubeconfig").arg(self.dir.path().join("server/admin.kubeconfig")).args(args);
        let (status, out, err) = common::run_with_stdin(&mut cmd, stdin);
        assert!(status.success(), "kubectl {args:?} failed: {err}");
        out
    }

    fn pod(&self, name: &str) -> Value {
        self.get(&format!("/api/v1/namespaces/default/pods/{name}"))
    }

    fn events(&self, reason: &str, pod: &str) -> Vec<Value> {
        let list = self.get("/api/v1/namespaces/default/events");
        list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == pod)
            .cloned()
            .collect()
    }

    /// Polls `f` until it returns `Some`, for at most `seconds`.
    fn wait_for<T>(&self, what: &str, seconds: u64, mut f: impl FnMut(&Cluster) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            if let Some(v) = f(self) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out after {seconds} s waiting for {what}\n{}", self.agent_logs());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until pod `name` runs and returns its podIP.
    fn running_ip(&self, name: &str) -> String {
        self.wait_for(&format!("pod {name} to run with an IP"), 90, |c| {
            let p = c.pod(name);
            let ip = p["status"]["podIP"].as_str()?.to_string();
            (p["status"]["phase"] == "Running" && p["status"]["podIPs"] == json!([{"ip": ip}])).then_some(ip)
        })
    }

    /// `curl http://IP:8080/` from inside `ns` (a node namespace, or a pod's via its pinned file).
    fn http_from(&self, netns: &str, ip: &str) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .args(["--", "curl", "-s", "-m", "5", &format!("http://{ip}:8080/")])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The file pinning pod `name`'s network namespace on `node`.
    fn pod_netns(&self, node: usize, name: &str) -> String {
        let uid = self.pod(name)["metadata"]["uid"].as_str().unwrap_or("").to_string();
        self.agent_dir(node).join("network/netns").join(uid).display().to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.agents.clear();
        self.server.take();
        // oci containers run under shims of their own, not the agent's: runc removes them.
        for i in 0..self.nodes.len() {
            let root = self.agent_dir(i).join("oci/runc");
            for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
                let _ = Command::new("runc").arg("--root").arg(&root).args(["delete", "--force"]).arg(e.file_name()).output();
            }
        }
        // Pinned pod and sandbox namespaces, image roots: mounts under the test's directory.
        for m in common::mounts_under(self.dir.path()) {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
    }
}

/// A pod on `node` serving its own name over HTTP on port 8080 (busybox httpd, as a host
/// process of the process runtime, with its files in `www`).
fn web_pod(name: &str, node: usize, www: &Path) -> String {
    let dir = www.join(name);
    std::fs::create_dir_all(&dir).expect("www dir");
    std::fs::write(dir.join("index.html"), format!("{name}\n")).expect("index.html");
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": format!("node-{node}"), "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "web", "image": "minimal",
                "command": ["busybox", "httpd", "-f", "-p", "8080", "-h", dir.display().to_string()]}]}})
    .to_string()
}

fn sleep_pod(name: &str, node: usize) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": format!("node-{node}"), "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "sleep", "image": "minimal", "command": ["sleep", "3600"]}]}})
    .to_string()
}

fn in_cidr(ip: &str, cidr: &str) -> bool {
    let Some((net, len)) = cidr.split_once('/') else { return false };
    let (Ok(ip), Ok(net), Ok(len)) = (ip.parse::<std::net::Ipv4Addr>(), net.parse::<std::net::Ipv4Addr>(), len.parse::<u32>()) else {
        return false;
    };
    let mask = u32::MAX << (32 - len);
    u32::from(ip) & mask == u32::from(net) & mask
}

#[test]
fn pods_share_a_port_on_one_node_reach_pods_on_another_and_keep_their_addresses_when_the_agent_is_killed() {
    let mut c = Cluster::start("a", 2, &[]);
    let www = c.dir.path().join("www");
    for (name, node) in [("web-a1", 0), ("web-a2", 0), ("web-b1", 1)] {
        c.kubectl(&["apply", "-f", "-"], Some(&web_pod(name, node, &www)));
    }
    let host = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "host-a"},
        "spec": {"nodeName": "node-0", "hostNetwork": true, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "sleep", "image": "minimal", "command": ["sleep", "3600"]}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&host.to_string()));

    let (a1, a2, b1) = (c.running_ip("web-a1"), c.running_ip("web-a2"), c.running_ip("web-b1"));
    let cidr_a = c.get("/api/v1/nodes/node-0")["spec"]["podCIDR"].as_str().unwrap_or("").to_string();
    let cidr_b = c.get("/api/v1/nodes/node-1")["spec"]["podCIDR"].as_str().unwrap_or("").to_string();
    assert_ne!(cidr_a, cidr_b, "each node has its own podCIDR");
    assert!(in_cidr(&a1, &cidr_a) && in_cidr(&a2, &cidr_a), "{a1} and {a2} come from node-0's {cidr_a}");
    assert!(in_cidr(&b1, &cidr_b), "{b1} comes from node-1's {cidr_b}");
    assert_ne!(a1, a2);
    assert_eq!(c.running_ip("host-a"), NODE_IPS[0], "a hostNetwork pod keeps the node's address");
    let wide = c.kubectl(&["get", "pods", "-o", "wide"], None);
    assert!(wide.contains(&format!(" {a1} ")) && wide.contains(&format!(" {b1} ")), "get -o wide shows pod IPs:\n{wide}");

    // Both pods of node-0 listen on port 8080; each answers on its own address.
    let node_a = c.nodes[0].path();
    assert_eq!(c.http_from(&node_a, &a1), "web-a1");
    assert_eq!(c.http_from(&node_a, &a2), "web-a2");
    // Pod to pod across nodes, through the routes each agent keeps to the other's podCIDR.
    let a1_ns = c.pod_netns(0, "web-a1");
    let b1_ns = c.pod_netns(1, "web-b1");
    let answer = c.wait_for("web-a1 to reach web-b1 on the other node", 30, |c| {
        Some(c.http_from(&a1_ns, &b1)).filter(|a| !a.is_empty())
    });
    assert_eq!(answer, "web-b1");
    assert_eq!(c.http_from(&b1_ns, &a2), "web-a2");

    // kill -9 and restart node-0's agent: the pods keep their addresses, and a new pod gets
    // one none of them has.
    if let Some(agent) = c.agents[0].as_mut() {
        agent.kill9();
        agent.cmdline.clear();
    }
    let restarted = c.start_agent(0);
    c.agents[0] = Some(restarted);
    c.kubectl(&["apply", "-f", "-"], Some(&web_pod("web-a3", 0, &www)));
    let a3 = c.running_ip("web-a3");
    assert!(!HashSet::from([a1.as_str(), a2.as_str(), NODE_IPS[0]]).contains(a3.as_str()), "{a3} reused an address in use");
    assert_eq!((c.running_ip("web-a1"), c.running_ip("web-a2")), (a1.clone(), a2.clone()), "addresses survive the agent");
    assert_eq!(c.http_from(&node_a, &a1), "web-a1");
    assert_eq!(c.http_from(&node_a, &a3), "web-a3");
    assert_eq!(c.http_from(&b1_ns, &a1), "web-a1", "the other node still reaches node-0's pods");

    // A deleted pod's address goes back to the pool and its namespace is gone.
    let a2_ns = c.pod_netns(0, "web-a2");
    c.kubectl(&["delete", "pod", "web-a2", "--wait=false"], None);
    c.wait_for("web-a2's address to be released", 60, |c| {
        let ipam = c.agent_dir(0).join("network/ipam").join(&a2);
        (!ipam.exists() && !Path::new(&a2_ns).exists()).then_some(())
    });

    // A pod that got an address but never a container (its ConfigMap is missing), force deleted
    // while no agent runs: the next agent finds nothing to adopt for it and still frees it.
    let waiting = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-config"},
        "spec": {"nodeName": "node-0", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "app", "image": "minimal", "command": ["sleep", "3600"],
                "envFrom": [{"configMapRef": {"name": "missing"}}]}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&waiting.to_string()));
    let stranded = c.wait_for("no-config to get an address", 60, |c| c.pod("no-config")["status"]["podIP"].as_str().map(str::to_string));
    if let Some(agent) = c.agents[0].as_mut() {
        agent.kill9();
        agent.cmdline.clear();
    }
    c.kubectl(&["delete", "pod", "no-config", "--force", "--grace-period=0"], None);
    let restarted = c.start_agent(0);
    c.agents[0] = Some(restarted);
    c.wait_for("the stranded address to be released", 60, |c| {
        (!c.agent_dir(0).join("network/ipam").join(&stranded).exists()).then_some(())
    });
    assert_eq!(c.http_from(&node_a, &a1), "web-a1", "releasing it left the others alone");
}

#[test]
fn a_pod_beyond_the_nodes_pod_cidr_gets_failed_create_pod_sandbox_and_runs_once_an_address_frees_up() {
    // A /29 per node: five pod addresses after the bridge's.
    let c = Cluster::start("b", 1, &["--node-cidr-mask-size", "29"]);
    for i in 0..5 {
        c.kubectl(&["apply", "-f", "-"], Some(&sleep_pod(&format!("fill-{i}"), 0)));
    }
    let ips: HashSet<String> = (0..5).map(|i| c.running_ip(&format!("fill-{i}"))).collect();
    assert_eq!(ips.len(), 5, "five pods, five addresses: {ips:?}");

    c.kubectl(&["apply", "-f", "-"], Some(&sleep_pod("one-too-many", 0)));
    let events = c.wait_for("a FailedCreatePodSandBox event", 60, |c| {
        Some(c.events("FailedCreatePodSandBox", "one-too-many")).filter(|e| !e.is_empty())
    });
    let message = events[0]["message"].as_str().unwrap_or("");
    assert_eq!(events[0]["type"], "Warning");
    assert!(message.contains("no free pod address") && message.contains("/29"), "{message}");
    let pod = c.pod("one-too-many");
    assert_eq!(pod["status"]["phase"], "Pending");
    assert!(pod["status"]["podIP"].is_null(), "no address, no podIP: {}", pod["status"]);
    assert_eq!(c.pod("fill-0")["status"]["phase"], "Running", "the agent goes on running the others");

    let freed = c.running_ip("fill-2");
    c.kubectl(&["delete", "pod", "fill-2", "--wait=false"], None);
    assert_eq!(c.running_ip("one-too-many"), freed, "the deleted pod's address was the only one free");
}

/// `kubectl port-forward` reaches the pod's own port, inside its network namespace (where its
/// `localhost` is), not the node's: the node's loopback has nothing on 8080.
#[test]
fn port_forward_reaches_a_pod_inside_its_network_namespace() {
    const STREAMING: &str = "network-test-streaming";
    let agent: &[&str] = &["--streaming-token", STREAMING, "--streaming-address", "0.0.0.0:0"];
    let c = Cluster::start_with("process", "pf", 1, &["--node-streaming-token", STREAMING], agent);
    let www = c.dir.path().join("www");
    c.kubectl(&["apply", "-f", "-"], Some(&web_pod("web-pf", 0, &www)));
    let ip = c.running_ip("web-pf");
    assert_eq!(c.http_from(&c.nodes[0].path(), &ip), "web-pf");
    assert_eq!(c.http_from(&c.nodes[0].path(), "127.0.0.1"), "", "the node's own loopback serves nothing on 8080");
    let port = common::free_port().to_string();
    let mut forward = c.server_ns.command(common::installed_kubectl());
    forward
        .arg("--kubeconfig")
        .arg(c.dir.path().join("server/admin.kubeconfig"))
        .args(["port-forward", "pod/web-pf", &format!("{port}:8080")])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _forward = common::KillOnDrop(forward.spawn().expect("kubectl port-forward"));
    let answer = c.wait_for("an answer through port-forward", 30, |c| {
        let out = c.server_ns.command("curl").args(["-s", "-m", "5", &format!("http://127.0.0.1:{port}/")]).output().ok()?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|a| !a.is_empty())
    });
    assert_eq!(answer, "web-pf");
}

#[test]
fn oci_containers_join_their_pods_network_namespace() {
    let runc = Command::new("runc").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(runc, "this test needs runc (package runc) for the oci runtime");
    let c = Cluster::start_on("oci", "c", 1, &[]);
    let www = c.dir.path().join("www");
    // `minimal` on the oci runtime is the host's root, read-only: busybox and the files are there.
    for name in ["oci-1", "oci-2"] {
        c.kubectl(&["apply", "-f", "-"], Some(&web_pod(name, 0, &www)));
    }
    let (ip1, ip2) = (c.running_ip("oci-1"), c.running_ip("oci-2"));
    assert_ne!(ip1, ip2);
    let node = c.nodes[0].path();
    assert_eq!(c.http_from(&node, &ip1), "oci-1");
    assert_eq!(c.http_from(&node, &ip2), "oci-2");
    // Nothing listens on the node's own address: each server is in its pod's namespace.
    assert_eq!(c.http_from(&node, NODE_IPS[0]), "");
}

/// `curl http://IP:PORT/` from inside `netns`: (curl's exit code, seconds curl took, body).
fn request_from(netns: &str, ip: &str, port: u16) -> (i32, f64, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["--", "curl", "-s", "-m", "3", "-w", "\n%{time_total}", &format!("http://{ip}:{port}/")])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, time) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (out.status.code().unwrap_or(-1), time.trim().parse().unwrap_or(f64::MAX), body.trim().to_string())
}

#[test]
fn a_service_spreads_requests_over_its_pods_refuses_at_once_without_endpoints_and_its_rules_come_back_when_flushed() {
    let runs = Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(runs, "this test needs nft (package nftables) for the Service data plane");
    let c = Cluster::start("d", 2, &[]);
    let www = c.dir.path().join("www");
    // Three busybox httpd pods on node-0, each serving its own name; a client pod on node-1.
    let script = format!(
        "d={}/$POD_NAME; mkdir -p $d; echo $POD_NAME > $d/index.html; exec busybox httpd -f -p 8080 -h $d",
        www.display()
    );
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"nodeName": "node-0", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "web", "image": "minimal", "command": ["busybox", "sh", "-c", script],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}}});
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&deployment.to_string()));
    c.kubectl(&["apply", "-f", "-"], Some(&service.to_string()));
    c.kubectl(&["apply", "-f", "-"], Some(&sleep_pod("client", 1)));
    c.running_ip("client");
    let client = c.pod_netns(1, "client");
    let cluster_ip = c.wait_for("the Service's ClusterIP", 30, |c| {
        c.get("/api/v1/namespaces/default/services/web")["spec"]["clusterIP"].as_str().map(str::to_string)
    });
    let ready_pods = |c: &Cluster| -> HashSet<String> {
        let eps = c.get("/api/v1/namespaces/default/endpoints/web");
        eps["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["addresses"].as_array().into_iter().flatten())
            .filter_map(|a| a["targetRef"]["name"].as_str().map(str::to_string))
            .collect()
    };
    let pods = c.wait_for("three ready endpoints", 90, |c| Some(ready_pods(c)).filter(|p| p.len() == 3));

    // From the other node, through the ClusterIP: every ready pod answers at least once in 60.
    c.wait_for("the ClusterIP to answer from node-1", 30, |_| (request_from(&client, &cluster_ip, 80).0 == 0).then_some(()));
    let mut answered = HashSet::new();
    for _ in 0..60 {
        let (code, _, body) = request_from(&client, &cluster_ip, 80);
        assert_eq!(code, 0, "a request to {cluster_ip}:80 failed");
        assert!(pods.contains(&body), "{body:?} is not one of the ready pods {pods:?}");
        answered.insert(body);
    }
    assert_eq!(answered, pods, "every ready pod answers");

    // sessionAffinity: ClientIP: one client, one pod.
    let sticky = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-sticky"},
        "spec": {"selector": {"app": "web"}, "sessionAffinity": "ClientIP", "ports": [{"port": 80, "targetPort": 8080}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&sticky.to_string()));
    let sticky_ip = c.wait_for("web-sticky's ClusterIP", 30, |c| {
        c.get("/api/v1/namespaces/default/services/web-sticky")["spec"]["clusterIP"].as_str().map(str::to_string)
    });
    c.wait_for("web-sticky to answer", 60, |_| (request_from(&client, &sticky_ip, 80).0 == 0).then_some(()));
    // The client sticks, through the resync that rebuilds the table after the change (without
    // affinity, 20 answers from one of 3 pods would take ~3^-19).
    let stuck: HashSet<String> = (0..20).map(|_| request_from(&client, &sticky_ip, 80).2).collect();
    assert_eq!(stuck.len(), 1, "one client, one pod: {stuck:?}");
    assert!(pods.is_superset(&stuck), "{stuck:?} are ready pods");
    // Another Service's arrival (its rules applied at once, the whole table rebuilt at the next
    // resync) leaves the clients where they are; the requests span more than one resync.
    let other = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web-other"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 81, "targetPort": 8080}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&other.to_string()));
    let other_ip = c.wait_for("web-other's ClusterIP", 30, |c| {
        c.get("/api/v1/namespaces/default/services/web-other")["spec"]["clusterIP"].as_str().map(str::to_string)
    });
    c.wait_for("web-other to answer", 60, |_| (request_from(&client, &other_ip, 81).0 == 0).then_some(()));
    let still: HashSet<String> = (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            request_from(&client, &sticky_ip, 80).2
        })
        .collect();
    assert_eq!(still, stuck, "the client stays with its pod across another Service's change");

    // No endpoint: refused at once, not left to time out.
    c.kubectl(&["scale", "deployment", "web", "--replicas=0"], None);
    c.wait_for("the endpoints to empty", 60, |c| ready_pods(c).is_empty().then_some(()));
    // A connection opened while the last endpoints went away may still wait on one of them.
    c.wait_for("a request to be refused at once", 30, |_| {
        let (code, took, _) = request_from(&client, &cluster_ip, 80);
        (code == 7 && took < 0.1).then_some(())
    });
    for _ in 0..5 {
        let (code, took, _) = request_from(&client, &cluster_ip, 80);
        assert!(code == 7 && took < 0.1, "every next request is refused at once (curl exit {code} after {took} s)");
    }

    // Rules removed by hand come back within a resync (one second by default).
    let node_1 = c.nodes[1].path();
    run(Command::new("nsenter").arg(format!("--net={node_1}")).args(["--", "nft", "flush", "table", "ip", "shepherd"]));
    let flushed = Instant::now();
    let listing = c.wait_for("the flushed table to come back", 30, |_| {
        let out = Command::new("nsenter").arg(format!("--net={node_1}")).args(["--", "nft", "list", "table", "ip", "shepherd"]).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        // `flush table` empties the chains and keeps the maps: wait for the rules.
        let rules = text.contains("th dport vmap @no-endpoint-services") && text.contains("jump services");
        (rules && text.contains(&format!("{cluster_ip} . tcp . 80 : goto reject-chain"))).then_some(text)
    });
    assert!(flushed.elapsed() < Duration::from_secs(10), "the table came back after {:?}:\n{listing}", flushed.elapsed());
    let (code, took, _) = request_from(&client, &cluster_ip, 80);
    assert!(code == 7 && took < 0.1, "refused again at once (curl exit {code} after {took} s)");

    // Scaled back: traffic resumes.
    c.kubectl(&["scale", "deployment", "web", "--replicas=1"], None);
    let body = c.wait_for("the ClusterIP to answer again", 90, |_| {
        let (code, _, body) = request_from(&client, &cluster_ip, 80);
        (code == 0).then_some(body)
    });
    assert!(body.starts_with("web-"), "{body}");

    // How long an informer event took to reach the kernel, as the agents logged it.
    let mut ms: Vec<f64> = (0..2)
        .flat_map(|i| std::fs::read_to_string(c.dir.path().join(format!("agent-{i}.log"))).unwrap_or_default().lines().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|l| l.split("event_to_rule_ms=").nth(1)?.split_whitespace().next()?.parse().ok())
        .collect();
    ms.sort_by(f64::total_cmp);
    assert!(!ms.is_empty(), "the agents log how long each change took to apply");
    eprintln!("endpoint change to rule: p50 {:.1} ms, max {:.1} ms over {} changes", ms[ms.len() / 2], ms[ms.len() - 1], ms.len());
}

impl Cluster {
    /// What pod `name` (on `node`) wrote to its standard output so far, one entry per line,
    /// read from the agent's log file of its container.
    fn log_lines(&self, node: usize, name: &str) -> Vec<String> {
        let uid = self.pod(name)["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let mut dirs = vec![self.agent_dir(node)];
        let mut text = String::new();
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = e.path();
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(path);
                } else if !uid.is_empty() && path.ends_with("current.log") && path.to_string_lossy().contains(&uid) {
                    text = std::fs::read_to_string(&path).unwrap_or_default();
                }
            }
        }
        // CRI format: TIMESTAMP STREAM TAG CONTENT.
        text.lines().filter_map(|l| l.splitn(4, ' ').nth(3)).map(str::to_string).collect()
    }

    /// Waits until pod `name` has logged `count` lines after its first `from`, and returns them.
    fn next_log_lines(&self, node: usize, name: &str, from: usize, count: usize) -> Vec<String> {
        self.wait_for(&format!("{count} more lines from {name}"), 120, |c| {
            let lines = c.log_lines(node, name);
            (lines.len() >= from + count).then(|| lines[from..from + count].to_vec())
        })
    }

    fn restart_agent(&mut self, node: usize) {
        if let Some(agent) = self.agents[node].as_mut() {
            agent.kill9();
            agent.cmdline.clear();
        }
        let restarted = self.start_agent(node);
        self.agents[node] = Some(restarted);
    }

    /// The names of the pods in Service `name`'s ready endpoints.
    fn ready_endpoints(&self, name: &str) -> HashSet<String> {
        let eps = self.get(&format!("/api/v1/namespaces/default/endpoints/{name}"));
        eps["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["addresses"].as_array().into_iter().flatten())
            .filter_map(|a| a["targetRef"]["name"].as_str().map(str::to_string))
            .collect()
    }
}

#[test]
fn a_client_pod_reaches_a_deployment_by_its_service_name_through_the_cluster_dns_on_node_ports_and_itself_across_agent_restarts() {
    let runs = Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(runs, "this test needs nft (package nftables) for the Service data plane");
    let dns = format!("{SERVER_IP}:53");
    let mut c = Cluster::start_with("process", "e", 2, &["--cluster-dns-listen", &dns], &["--cluster-dns", "10.96.0.10"]);
    // The cluster DNS runs in the server's namespace, off the pod network: its replies to pods
    // go back by the nodes, as a control-plane host of a cluster routes pod CIDRs.
    for (i, node_ip) in NODE_IPS.iter().enumerate() {
        let cidr = c.get(&format!("/api/v1/nodes/node-{i}"))["spec"]["podCIDR"].as_str().unwrap_or("").to_string();
        c.server_ns.ip(&["route", "add", &cidr, "via", node_ip]);
    }
    let www = c.dir.path().join("www");
    // Three busybox httpd on node-0 serving their name at / and their downward-API podIP at
    // /ip; they ignore SIGTERM, so a deleted one goes on serving for its grace period.
    let script = format!(
        "trap '' TERM; d={}/$POD_NAME; mkdir -p $d; echo $POD_NAME > $d/index.html; echo $POD_IP > $d/ip; \
         exec busybox httpd -f -p 8080 -h $d",
        www.display()
    );
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"nodeName": "node-0", "terminationGracePeriodSeconds": 20,
                    "containers": [{"name": "web", "image": "minimal", "command": ["sh", "-c", script],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}]}}}});
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"type": "NodePort", "selector": {"app": "web"}, "ports": [{"port": 8080, "targetPort": 8080}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&deployment.to_string()));
    c.kubectl(&["apply", "-f", "-"], Some(&service.to_string()));
    // The client on node-1 asks for the Service by name, over and over, and prints each answer.
    let client = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "client", "image": "minimal", "command": ["sh", "-c",
                "while true; do a=$(wget -qO- -T 3 -t 1 http://web.default.svc.cluster.local:8080 2>&1) || a=\"FAIL $a\"; \
                 echo $a; sleep 0.05; done"]}]}});
    c.kubectl(&["apply", "-f", "-"], Some(&client.to_string()));
    let pods = c.wait_for("three ready endpoints", 120, |c| Some(c.ready_endpoints("web")).filter(|p| p.len() == 3));

    // Over 60 requests every ready pod answers.
    let answered_from = c.wait_for("the client to get an answer by name", 60, |c| {
        let lines = c.log_lines(1, "client");
        lines.iter().position(|l| pods.contains(l)).map(|i| i + 1)
    });
    let sixty = c.next_log_lines(1, "client", answered_from, 60);
    let failed: Vec<&String> = sixty.iter().filter(|l| !pods.contains(*l)).collect();
    assert!(failed.is_empty(), "every request is answered by a ready pod: {failed:?}");
    assert_eq!(sixty.iter().cloned().collect::<HashSet<_>>(), pods, "every ready pod answers within 60 requests");

    // The downward API's status.podIP is the pod's own address.
    let node_0 = c.nodes[0].path();
    for pod in &pods {
        let ip = c.running_ip(pod);
        let out = Command::new("nsenter")
            .arg(format!("--net={node_0}"))
            .args(["--", "curl", "-s", "-m", "5", &format!("http://{ip}:8080/ip")])
            .output()
            .expect("curl");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), ip, "{pod}'s POD_IP");
    }

    // NodePort: from outside the nodes (the server's namespace) to either node's address, the
    // one without an endpoint included.
    let node_port = c.get("/api/v1/namespaces/default/services/web")["spec"]["ports"][0]["nodePort"].as_u64().unwrap_or(0);
    assert!((30000..=32767).contains(&node_port), "a node port from the default range: {node_port}");
    let server_ns = c.server_ns.path();
    for node_ip in NODE_IPS {
        let body = c.wait_for(&format!("{node_ip}:{node_port} to answer"), 30, |_| {
            let (code, _, body) = request_from(&server_ns, node_ip, node_port as u16);
            (code == 0).then_some(body)
        });
        assert!(pods.contains(&body), "{node_ip}:{node_port} answered {body:?}");
    }

    let listed = c.kubectl(&["get", "service", "web"], None);
    assert!(listed.contains(&format!("8080:{node_port}/TCP")), "kubectl get shows the node port:\n{listed}");
    let described = c.kubectl(&["describe", "service", "web"], None);
    let endpoints_line = described.lines().find(|l| l.starts_with("Endpoints:")).unwrap_or("");
    for pod in &pods {
        let ip = c.running_ip(pod);
        assert!(endpoints_line.contains(&format!("{ip}:8080")), "kubectl describe lists {pod}'s endpoint:\n{described}");
    }
    let slices = c.kubectl(&["get", "endpointslices", "-l", "kubernetes.io/service-name=web"], None);
    for pod in &pods {
        let ip = c.running_ip(pod);
        assert!(slices.contains(&ip), "kubectl get endpointslices lists {pod}'s address:\n{slices}");
    }
    let node_port_line = described.lines().find(|l| l.starts_with("NodePort:")).unwrap_or("");
    assert!(node_port_line.ends_with(&format!(" {node_port}/TCP")), "{described}");

    // Hairpin: a pod reaching its own Service gets answers, its own among them.
    let me = pods.iter().next().cloned().unwrap_or_default();
    let my_ns = c.pod_netns(0, &me);
    let cluster_ip = c.get("/api/v1/namespaces/default/services/web")["spec"]["clusterIP"].as_str().unwrap_or("").to_string();
    let mut answers = HashSet::new();
    for _ in 0..20 {
        let (code, _, body) = request_from(&my_ns, &cluster_ip, 8080);
        assert_eq!(code, 0, "{me} reaching {cluster_ip}:8080 failed (curl exit {code})");
        answers.insert(body);
    }
    assert!(answers.contains(&me), "{me} was never answered by itself through its Service: {answers:?}");

    // A deleted pod serves on through its grace period, but once its endpoint is gone no
    // request reaches it.
    let victim = me;
    let victim_ip = c.running_ip(&victim);
    c.kubectl(&["delete", "pod", &victim, "--wait=false"], None);
    c.wait_for("the deleted pod's endpoint to go", 60, |c| (!c.ready_endpoints("web").contains(&victim)).then_some(()));
    let gone_at = c.log_lines(1, "client").len();
    // One request may have been under way when the endpoint went.
    let after = c.next_log_lines(1, "client", gone_at + 1, 40);
    assert!(!after.contains(&victim), "{victim} answered after its endpoint was removed: {after:?}");
    assert!(after.iter().all(|l| !l.starts_with("FAIL")), "the others answer: {after:?}");
    assert_eq!(c.http_from(&node_0, &victim_ip), victim, "the deleted pod was still there to answer");

    // kill -9 and restart both agents: every pod keeps its address, every Service works, and a
    // new pod gets an address no running pod has.
    let pods = c.wait_for("three ready endpoints again", 120, |c| Some(c.ready_endpoints("web")).filter(|p| p.len() == 3));
    let mut addresses: HashSet<String> = pods.iter().map(|p| c.running_ip(p)).collect();
    addresses.insert(c.running_ip("client"));
    for node in 0..2 {
        c.restart_agent(node);
    }
    let before = c.log_lines(1, "client").len();
    // The restarted agents rebuild their tables: let a few requests through first.
    let settled = c.wait_for("the client to be answered after the restarts", 60, |c| {
        let lines = c.log_lines(1, "client");
        lines.iter().skip(before).position(|l| pods.contains(l)).map(|i| before + i + 1)
    });
    let later = c.next_log_lines(1, "client", settled, 30);
    assert!(later.iter().all(|l| pods.contains(l)), "answers after the restarts: {later:?}");
    let now: HashSet<String> = pods.iter().chain(["client".to_string()].iter()).map(|p| c.running_ip(p)).collect();
    assert_eq!(now, addresses, "every pod keeps its address");
    let (code, _, _) = request_from(&server_ns, NODE_IPS[1], node_port as u16);
    assert_eq!(code, 0, "the node port still answers");
    c.kubectl(&["scale", "deployment", "web", "--replicas=4"], None);
    let grown = c.wait_for("a fourth ready endpoint", 120, |c| Some(c.ready_endpoints("web")).filter(|p| p.len() == 4));
    let new_pod = grown.difference(&pods).next().cloned().unwrap_or_default();
    let new_ip = c.running_ip(&new_pod);
    assert!(!addresses.contains(&new_ip), "{new_pod} got {new_ip}, an address in use");
}
