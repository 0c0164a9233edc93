//! Scenario `auth-cost`: what security costs a request. The same reads and writes against a plain
//! HTTP server without authentication and a TLS server that authenticates every request by token
//! and authorizes it against 1,000 RoleBindings (as an administrator, whom RBAC does not consult,
//! and as a user it does), then with an audit log as well: server CPU and latency per request.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::Process;
use crate::procstat;
use crate::report::{ScenarioResult, Summary, summarize};

const ADMIN: &str = "bench-admin-token";
const USER: &str = "bench-user-token";
const PODS: &str = "/api/v1/namespaces/default/pods";

/// One way of reaching a server.
struct Target {
    name: &'static str,
    server: usize,
    http: reqwest::Client,
    token: Option<&'static str>,
}

#[derive(Default)]
struct Tally {
    cpu_seconds: f64,
    reads: Vec<Duration>,
    writes: Vec<Duration>,
    /// What the server's own histograms say authentication and authorization took.
    authn: Histogram,
    authz: Histogram,
}

/// A Prometheus histogram as scraped: cumulative bucket counts by upper bound, sum and count.
#[derive(Default, Clone, Debug, PartialEq)]
struct Histogram {
    buckets: Vec<(f64, u64)>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// `name`'s histogram in a text exposition; empty when the server has none.
    fn parse(text: &str, name: &str) -> Histogram {
        let mut h = Histogram::default();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix(name) else { continue };
            let Some((key, value)) = rest.rsplit_once(' ') else { continue };
            if let Some(le) = key.strip_prefix("_bucket{le=\"").and_then(|k| k.strip_suffix("\"}")) {
                let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
                h.buckets.push((bound, value.parse().unwrap_or(0)));
            } else if key == "_sum" {
                h.sum = value.parse().unwrap_or(0.0);
            } else if key == "_count" {
                h.count = value.parse().unwrap_or(0);
            }
        }
        h
    }

    /// Adds what happened between the scrapes `before` and `after`.
    fn add_between(&mut self, before: &Histogram, after: &Histogram) {
        if self.buckets.is_empty() {
            self.buckets = after.buckets.iter().map(|(le, _)| (*le, 0)).collect();
        }
        for ((total, (_, a)), (_, b)) in self.buckets.iter_mut().zip(&after.buckets).zip(&before.buckets) {
            total.1 += a.saturating_sub(*b);
        }
        self.sum += after.sum - before.sum;
        self.count += after.count.saturating_sub(before.count);
    }

    fn mean_us(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.sum * 1e6 / self.count as f64 }
    }

    /// The upper bound of the bucket holding quantile `q`, in microseconds.
    fn quantile_us(&self, q: f64) -> f64 {
        let want = (q * self.count as f64).ceil() as u64;
        self.buckets.iter().find(|(_, n)| *n >= want.max(1)).map_or(0.0, |(le, _)| le * 1e6)
    }
}

/// The server's authentication and authorization histograms, read as the administrator.
async fn auth_histograms(t: &Target, url: &str) -> anyhow::Result<(Histogram, Histogram)> {
    let Some(_) = t.token else { return Ok(Default::default()) };
    let text = t.http.get(format!("{url}/metrics")).bearer_auth(ADMIN).send().await?.error_for_status()?.text().await?;
    Ok((
        Histogram::parse(&text, "apiserver_authentication_duration_seconds"),
        Histogram::parse(&text, "apiserver_authorization_duration_seconds"),
    ))
}

fn pod() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": {"round": "0"}},
        "spec": {"containers": [{"name": "c", "image": "minimal"}]}})
}

/// `n` reads (GET of one pod) and `n` writes (a merge patch of its label); returns the server CPU
/// they cost.
async fn round(server: &Process, t: &Target, url: &str, n: usize, tally: &mut Tally) -> anyhow::Result<()> {
    let pid = server.child.id().to_string();
    let item = format!("{url}{PODS}/probe");
    let auth = |r: reqwest::RequestBuilder| match t.token {
        Some(token) => r.bearer_auth(token),
        None => r,
    };
    let (authn_before, authz_before) = auth_histograms(t, url).await?;
    let cpu = procstat::cpu_seconds(&pid);
    for i in 0..n {
        let started = Instant::now();
        let r = auth(t.http.get(&item)).send().await?;
        anyhow::ensure!(r.status().is_success(), "{}: GET answered {}", t.name, r.status());
        r.bytes().await?;
        tally.reads.push(started.elapsed());
        let started = Instant::now();
        let r = auth(t.http.patch(&item))
            .header("content-type", "application/merge-patch+json")
            .body(json!({"metadata": {"labels": {"round": i.to_string()}}}).to_string())
            .send()
            .await?;
        anyhow::ensure!(r.status().is_success(), "{}: PATCH answered {}", t.name, r.status());
        r.bytes().await?;
        tally.writes.push(started.elapsed());
    }
    tally.cpu_seconds += procstat::cpu_seconds(&pid) - cpu;
    let (authn_after, authz_after) = auth_histograms(t, url).await?;
    tally.authn.add_between(&authn_before, &authn_after);
    tally.authz.add_between(&authz_before, &authz_after);
    Ok(())
}

/// 1,000 RoleBindings in `default` for other users, and one granting the bench user `edit`.
async fn bind(http: &reqwest::Client, url: &str, bindings: usize) -> anyhow::Result<()> {
    let binding = |name: String, user: &str, role: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]})
    };
    let post = |body: serde_json::Value| {
        http.post(format!("{url}/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings")).bearer_auth(ADMIN).json(&body).send()
    };
    for i in 0..bindings {
        let r = post(binding(format!("other-{i}"), &format!("user-{i}"), "view")).await?;
        anyhow::ensure!(r.status().as_u16() == 201, "creating RoleBinding {i}: {}", r.status());
    }
    let r = post(binding("bench-edit".into(), "bench-user", "edit")).await?;
    anyhow::ensure!(r.status().as_u16() == 201, "binding the bench user: {}", r.status());
    // The authorizer follows RBAC through the store's watch: wait until the user may write.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = http.get(format!("{url}{PODS}")).bearer_auth(USER).send().await?;
        if r.status().is_success() {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the bench user's binding never took effect: {}", r.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn run(binary: &Path, requests: usize, rounds: usize, bindings: usize) -> anyhow::Result<ScenarioResult> {
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, format!("{ADMIN},bench-admin,1,\"system:masters\"\n{USER},bench-user,2,\"bench\"\n"))?;
    let data = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    let common = ["server", "--controllers", "none"];
    let plain = Process::start(binary, &[&common[..], &["--data-dir", &data("plain")]].concat())?;
    // A limit far above the rate measured: its check is part of the cost, its refusals are not.
    let secure_args = |name: &str| {
        vec!["--data-dir".to_string(), data(name), "--token-auth-file".into(), tokens.to_string_lossy().into_owned(),
            "--user-write-rate".into(), "1000000".into()]
    };
    let start_secure = |extra: Vec<String>| {
        let args: Vec<&str> = common.iter().copied().chain(extra.iter().map(String::as_str)).collect();
        Process::start_secure(binary, &args)
    };
    let secure = start_secure(secure_args("secure"))?;
    let mut audited_args = secure_args("audited");
    audited_args.extend(["--audit-log-path".into(), data("audit.log")]);
    let audited = start_secure(audited_args)?;
    let servers = [&plain, &secure, &audited];

    let https = |ca: &str| -> anyhow::Result<reqwest::Client> {
        let pem = std::fs::read(Path::new(&data(ca)).join("pki/ca.crt"))?;
        Ok(reqwest::Client::builder().tls_built_in_root_certs(false).add_root_certificate(reqwest::Certificate::from_pem(&pem)?).build()?)
    };
    let (secure_http, audited_http) = (https("secure")?, https("audited")?);
    let targets = [
        Target { name: "plain HTTP, no authentication", server: 0, http: reqwest::Client::new(), token: None },
        Target { name: "TLS, token, system:masters", server: 1, http: secure_http.clone(), token: Some(ADMIN) },
        Target { name: "TLS, token, RBAC (edit)", server: 1, http: secure_http, token: Some(USER) },
        Target { name: "TLS, token, RBAC, audit log", server: 2, http: audited_http, token: Some(USER) },
    ];
    println!("scenario auth-cost: requests={requests} reads and writes per way, in {rounds} rounds; {bindings} RoleBindings");
    for (i, s) in servers.iter().enumerate() {
        let (http, token) = (&targets.iter().find(|t| t.server == i).expect("a target per server").http, i > 0);
        if token {
            bind(http, &s.url, bindings).await?;
        }
        let mut create = http.post(format!("{}{PODS}", s.url)).json(&pod());
        if token {
            create = create.bearer_auth(ADMIN);
        }
        let r = create.send().await?;
        anyhow::ensure!(r.status().as_u16() == 201, "creating the probe pod: {}", r.status());
    }
    // Warm every path (connections, TLS sessions, caches), then alternate the ways round by round
    // so that drift in the machine's load falls on all of them alike.
    for t in &targets {
        round(servers[t.server], t, &servers[t.server].url, 20.min(requests), &mut Tally::default()).await?;
    }
    let mut tallies: Vec<Tally> = targets.iter().map(|_| Tally::default()).collect();
    let per_round = requests.div_ceil(rounds.max(1));
    for _ in 0..rounds.max(1) {
        for (t, tally) in targets.iter().zip(tallies.iter_mut()) {
            round(servers[t.server], t, &servers[t.server].url, per_round, tally).await?;
        }
    }
    let mut rows = Vec::new();
    let base_cpu = tallies[0].cpu_seconds;
    for (t, tally) in targets.iter().zip(&tallies) {
        let n = tally.reads.len() + tally.writes.len();
        let cpu_us = tally.cpu_seconds * 1e6 / n as f64;
        let (reads, writes): (Summary, Summary) = (summarize(&tally.reads), summarize(&tally.writes));
        let ratio = if base_cpu > 0.0 { tally.cpu_seconds / base_cpu } else { 0.0 };
        println!("{:<32} {cpu_us:>6.0} us CPU/request (x{ratio:.2}); GET {reads}; PATCH {writes}", t.name);
        // The server's own timing of the two layers, apart from TLS and the handlers.
        let (authn, authz) = (&tally.authn, &tally.authz);
        let layers_us = authn.mean_us() + authz.mean_us();
        let share = if cpu_us > 0.0 { 100.0 * layers_us / cpu_us } else { 0.0 };
        let base_share = if base_cpu > 0.0 { 100.0 * layers_us * n as f64 / (base_cpu * 1e6) } else { 0.0 };
        if authn.count > 0 {
            println!(
                "{:<32} authn mean {:.1} us (p50 <= {:.1}, p99 <= {:.1}), authz mean {:.1} us (p50 <= {:.1}, p99 <= {:.1}): \
                 {layers_us:.1} us = {share:.2}% of this way's CPU/request, {base_share:.2}% of plain HTTP's",
                "",
                authn.mean_us(),
                authn.quantile_us(0.5),
                authn.quantile_us(0.99),
                authz.mean_us(),
                authz.quantile_us(0.5),
                authz.quantile_us(0.99),
            );
        }
        let layer = |h: &Histogram| json!({"n": h.count, "mean_us": h.mean_us(), "p50_us_at_most": h.quantile_us(0.5),
            "p99_us_at_most": h.quantile_us(0.99)});
        rows.push(json!({"way": t.name, "cpu_us_per_request": cpu_us, "cpu_ratio_to_plain": ratio,
            "get": reads, "patch": writes, "authentication": layer(authn), "authorization": layer(authz),
            "authn_authz_us": layers_us, "authn_authz_percent_of_cpu": share,
            "authn_authz_percent_of_plain_cpu": base_share}));
    }
    let load = procstat::load_average();
    println!("load average: {load:.2}");
    Ok(ScenarioResult {
        name: "auth-cost",
        params: json!({"requests": requests, "rounds": rounds, "bindings": bindings}),
        values: json!({"ways": rows, "load_average": load}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = "# TYPE apiserver_authentication_duration_seconds histogram\n\
        apiserver_authentication_duration_seconds_sum 0.003\n\
        apiserver_authentication_duration_seconds_count 4\n\
        apiserver_authentication_duration_seconds_bucket{le=\"1.0e-6\"} 0\n\
        apiserver_authentication_duration_seconds_bucket{le=\"0.00001\"} 3\n\
        apiserver_authentication_duration_seconds_bucket{le=\"+Inf\"} 4\n\
        apiserver_authorization_duration_seconds_sum 9.0\n# EOF\n";

    #[test]
    fn a_scraped_histogram_gives_the_mean_and_quantile_bounds_of_what_happened_between_scrapes() {
        let after = Histogram::parse(SCRAPE, "apiserver_authentication_duration_seconds");
        assert_eq!(after.count, 4);
        assert_eq!(after.buckets.len(), 3);
        let mut between = Histogram::default();
        between.add_between(&Histogram { buckets: vec![(1e-6, 0), (1e-5, 1), (f64::INFINITY, 1)], sum: 0.001, count: 1 }, &after);
        assert_eq!(between.count, 3);
        assert!((between.mean_us() - 666.67).abs() < 0.1, "{}", between.mean_us());
        assert!((between.quantile_us(0.5) - 10.0).abs() < 1e-9);
        assert!(between.quantile_us(0.99).is_infinite());
        assert_eq!(Histogram::parse(SCRAPE, "apiserver_authorization_duration_seconds").sum, 9.0);
    }
}
