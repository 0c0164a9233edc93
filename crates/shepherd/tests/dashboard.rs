//! The dashboard in a real browser: Debian's headless Chromium, driven over WebDriver by
//! chromedriver, against a real `shepherd standalone` serving TLS with authentication, running the
//! seed's Deployment as processes. One cluster and one browser serve every step: what people
//! would do, in order: a wrong token, a user who may only look, then the administrator.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Daemon;
use fantoccini::{Client, Locator};
use serde_json::{Value, json};
use shepherd_dashboard::webdriver::Browser;

const DESKTOP: (u32, u32) = (1280, 900);
const PHONE: (u32, u32) = (390, 844);

/// Runs `script` in the page until it returns something truthy, and returns that; on time-out,
/// fails with what the page showed.
async fn wait_for(browser: &Browser, what: &str, script: &str) -> Value {
    // Generous: on a loaded machine (scripts/under-load.sh) a step can take tens of seconds.
    match browser.wait_for(script, Duration::from_secs(90)).await {
        Ok(v) => v,
        Err(last) => {
            let page = browser.client.execute(SEEN, vec![]).await.unwrap_or_else(|e| json!(e.to_string()));
            panic!("timed out waiting for {what}; last answer: {last}; the page showed: {page:#}");
        }
    }
}

/// What the page shows, for a failure message.
const SEEN: &str = "return {errors: window.dashboardErrors, connection: document.getElementById('connection')?.textContent,
    pods: [...document.querySelectorAll('tr[data-pod]')].map(r => r.dataset.pod + ' ' + r.dataset.uid + ' ' + r.dataset.phase + ' '
      + r.textContent),
    deployments: [...document.querySelectorAll('[data-deployment]')].map(d => d.textContent),
    podsError: document.getElementById('pods-error')?.textContent,
    signIn: document.getElementById('login')?.hidden ? 'hidden' : document.getElementById('token-error')?.textContent || 'shown',
    rowErrors: [...document.querySelectorAll('tr[data-pod] .field-error')].map(p => p.textContent).filter(Boolean),
    events: [...document.querySelectorAll('#events li')].slice(0, 12).map(li => li.textContent)};";

async fn js(client: &Client, script: &str) -> Value {
    client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

/// WebDriver's keys (the spec's table of normalized key values).
const CONTROL: &str = "\u{E009}";
const RELEASE_MODIFIERS: &str = "\u{E000}";
const ENTER: &str = "\u{E007}";
const ESCAPE: &str = "\u{E00C}";

/// Types `text` into the field `css` over what it held, as a person does: a click into it, Ctrl+A,
/// then the keys, with the focus in the field throughout (WebDriver's Element Clear would blur it,
/// and a redraw landing after that may refill the field before the keys arrive).
async fn type_into(client: &Client, css: &str, text: &str) -> fantoccini::elements::Element {
    let field = client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no field {css}: {e}"));
    field.click().await.unwrap_or_else(|e| panic!("click into {css}: {e}"));
    field.send_keys(&format!("{CONTROL}a{RELEASE_MODIFIERS}{text}")).await.unwrap_or_else(|e| panic!("type into {css}: {e}"));
    field
}

/// Types `text` into the field `css` (replacing what it held) and presses Enter to submit its form.
async fn submit(client: &Client, css: &str, text: &str) {
    type_into(client, css, text).await.send_keys(ENTER).await.expect("press Enter");
}

/// Waits until the page has drawn `view` `n` more times (`dashboardPerf.rendered`): a positive
/// signal that redraws happened, whatever the machine's speed.
async fn redraws(browser: &Browser, view: &str, n: u64) {
    let count = format!("return window.dashboardPerf.rendered['{view}'] || 0;");
    let now = js(&browser.client, &count).await.as_u64().expect("a draw count");
    let more = format!("return (window.dashboardPerf.rendered['{view}'] || 0) >= {};", now + n);
    wait_for(browser, &format!("{n} redraws of the {view} view"), &more).await;
}

/// The page's own record of uncaught errors and rejected promises; none may happen.
async fn assert_no_page_errors(client: &Client, page: &str) {
    let errors = js(client, "return window.dashboardErrors;").await;
    assert_eq!(errors, json!([]), "JavaScript errors on the {page} page");
}

fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/screenshots")
}

async fn screenshots(client: &Client, name: &str) {
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    for (width_name, (w, h)) in [("desktop", DESKTOP), ("phone", PHONE)] {
        client.set_window_size(w, h).await.expect("resize");
        // Laid out at the new width: the browser has drawn two frames since it took the size.
        let frames = "const done = arguments[arguments.length - 1];
            requestAnimationFrame(() => requestAnimationFrame(() => done(window.innerWidth)));";
        let width = client.execute_async(frames, vec![]).await.expect("two frames");
        assert!(width.as_u64().is_some_and(|got| got <= u64::from(w)), "window {width} wide, asked {w}");
        let png = client.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
        std::fs::write(dir.join(format!("dashboard-{name}-{width_name}.png")), png).expect("write screenshot");
        let overflow = js(client, "return document.documentElement.scrollWidth > window.innerWidth + 1;").await;
        assert_eq!(overflow, json!(false), "the {name} page scrolls sideways at {w}px");
    }
    client.set_window_size(DESKTOP.0, DESKTOP.1).await.expect("resize back");
}

/// Fills in and applies a controller's demo form on the loop page.
async fn tune_from_page(client: &Client, card: &str, mode: &str, period: &str, loss: &str) {
    let select = client.find(Locator::Css(&format!("{card} select[name=\"mode\"]"))).await.expect("mode select");
    select.select_by_value(mode).await.expect("choose a mode");
    for (name, value) in [("periodSeconds", period), ("eventLoss", loss)] {
        type_into(client, &format!("{card} input[name=\"{name}\"]"), value).await;
    }
    client.find(Locator::Css(&format!("{card} form.demo button"))).await.expect("apply").click().await.expect("click apply");
}

/// The administrator's token (`--token`), which the test uses to set the cluster up and check it.
const ADMIN: &str = "admin-t0ken-for-the-test";
/// Users of `--token-auth-file`: alice is bound to cluster-admin, victor to view.
const ALICE: &str = "alice-t0ken-0123456789";
const VICTOR: &str = "victor-t0ken-0123456789";

/// `shepherd standalone` over TLS with the tokens above; returns it and the line it printed on
/// where the dashboard is (its other output goes on to the test's stderr).
fn secure_standalone(dir: &Path, extra: &[&str]) -> (Daemon, String) {
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, format!("{ALICE},alice,1001\n{VICTOR},victor,1002\n")).expect("token file");
    let tokens = tokens.to_str().expect("utf-8 path");
    standalone(dir, &[&["--token", ADMIN, "--token-auth-file", tokens], extra].concat())
}

/// `shepherd standalone` over TLS in `dir/data` with `flags`; returns it and its `dashboard:` line.
fn standalone(dir: &Path, flags: &[&str]) -> (Daemon, String) {
    let (daemon, said) = common::standalone_with_stderr(&dir.join("data"), &[&["--runtime", "process"], flags].concat());
    assert!(daemon.url.starts_with("https://"), "served without TLS: {}", daemon.url);
    let line = common::line_starting(&said, "dashboard: ", Duration::from_secs(30));
    (daemon, line)
}

/// A client that trusts the cluster CA of `dir`'s standalone.
fn https_client(dir: &Path) -> reqwest::Client {
    let pem = std::fs::read(dir.join("data/pki/ca.crt")).expect("the cluster CA is in the data dir");
    let ca = reqwest::Certificate::from_pem(&pem).expect("CA");
    reqwest::Client::builder().tls_built_in_root_certs(false).add_root_certificate(ca).build().expect("client")
}

async fn deployment(http: &reqwest::Client, url: &str) -> Value {
    let r = http.get(format!("{url}/apis/apps/v1/namespaces/default/deployments/web")).bearer_auth(ADMIN).send().await;
    r.expect("get").json().await.expect("json")
}

/// Binds `user` to the ClusterRole `role`, as the administrator.
async fn bind(http: &reqwest::Client, url: &str, user: &str, role: &str) {
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{user}-{role}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]});
    let r = http.post(format!("{url}/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")).bearer_auth(ADMIN).json(&binding);
    let r = r.send().await.expect("bind");
    assert_eq!(r.status(), 201, "binding {user} to {role}");
}

/// Signs in from the page's form, typing the token and pressing Enter as a person would.
async fn sign_in(browser: &Browser, token: &str) {
    wait_for(browser, "the sign-in form", "return !document.getElementById('login').hidden;").await;
    submit(&browser.client, "#token", token).await;
}

const SIGNED_IN: &str = "return document.getElementById('login').hidden && document.body.dataset.auth === 'ok';";

/// A script that is true once the Deployment's card shows `n` ready replicas.
fn ready_is(n: u32) -> String {
    format!("return document.querySelector('[data-deployment=\"default/web\"]')?.dataset.ready === '{n}';")
}

/// How many keys the replicaset controller's queue chart shows added.
const ADDED: &str = "return Number(document.querySelector('[data-controller=\"replicaset\"] svg')?.dataset.added || 0);";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_cluster_and_its_loop_live_and_acts_on_what_a_person_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/results");
    let results = results.to_str().expect("utf-8 path");
    let (daemon, printed) = secure_standalone(dir.path(), &["--restart-backoff-seconds", "0.2", "--dashboard-demo", "--bench-results", results]);
    let url = daemon.url.clone();
    assert_eq!(printed, format!("dashboard: {url}/dashboard/ (sign in with the --token value)"));
    let http = https_client(dir.path());
    bind(&http, &url, "alice", "cluster-admin").await;
    bind(&http, &url, "victor", "view").await;
    let browser = Browser::start(DESKTOP.0, DESKTOP.1).await.unwrap_or_else(|e| panic!("{e}"));
    let client = browser.client.clone();

    let seed = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let created = http.post(format!("{url}/apis/apps/v1/namespaces/default/deployments")).bearer_auth(ADMIN).json(&seed);
    let created = created.send().await.expect("create");
    assert!(created.status().is_success(), "create: {}", created.status());

    // Signed out, the page asks for a token, with the focus in the field; a wrong one gets the
    // server's answer beside it.
    client.goto(&format!("{url}/dashboard/")).await.expect("open the dashboard");
    wait_for(&browser, "the sign-in form", "return !document.getElementById('login').hidden;").await;
    wait_for(&browser, "the focus in the token field", "return document.activeElement?.id === 'token';").await;
    screenshots(&client, "sign-in").await;
    sign_in(&browser, "not-a-token-of-this-server").await;
    let refused = wait_for(&browser, "the refusal", "return document.getElementById('token-error').textContent;").await;
    assert_eq!(refused, json!("Unauthorized"), "the server's 401 message");
    assert_eq!(js(&client, "return document.getElementById('login').hidden;").await, json!(false));

    // victor may look: he sees the Deployment and its pods, the server's 403 where he may not
    // read (nodes, the controllers), and its 403 beside the control when he deletes a pod or
    // scales; nothing changes.
    sign_in(&browser, VICTOR).await;
    wait_for(&browser, "victor signed in", SIGNED_IN).await;
    wait_for(&browser, "3 ready replicas, as victor sees them", &ready_is(3)).await;
    wait_for(&browser, "3 running pods", "return document.querySelectorAll('tr[data-pod^=\"default/web-\"][data-phase=\"Running\"]').length === 3;").await;
    let nodes = wait_for(&browser, "the nodes refused", "return document.querySelector('#nodes .forbidden')?.textContent;").await;
    assert!(nodes.as_str().is_some_and(|m| m.contains("User \"victor\" cannot list resource \"nodes\"")), "{nodes}");
    let before = deployment(&http, &url).await;
    let row = "document.querySelector('tr[data-pod^=\"default/web-\"]')";
    let (key, uid) = (js(&client, &format!("return {row}.dataset.pod;")).await, js(&client, &format!("return {row}.dataset.uid;")).await);
    let key = key.as_str().expect("a pod key").to_string();
    let name = key.trim_start_matches("default/");
    client.find(Locator::Css(&format!("button[aria-label=\"Delete pod {name}\"]"))).await.expect("delete button").click().await.expect("click");
    let shown = wait_for(&browser, "the 403 beside the Delete button",
        &format!("return document.querySelector('tr[data-pod=\"{key}\"] .field-error')?.textContent;")).await;
    assert!(shown.as_str().is_some_and(|m| m.contains("User \"victor\" cannot delete resource \"pods\"")), "{shown}");
    submit(&client, "input[data-deployment=\"default/web\"]", "4").await;
    let shown = wait_for(&browser, "the 403 beside the replicas field", "return document.querySelector('[data-action=\"scale\"] .field-error')?.textContent;").await;
    assert!(shown.as_str().is_some_and(|m| m.contains("cannot patch resource \"deployments/scale\"")), "{shown}");
    let pod = http.get(format!("{url}/api/v1/namespaces/default/pods/{name}")).bearer_auth(ADMIN);
    let pod: Value = pod.send().await.expect("get pod").json().await.expect("json");
    assert_eq!(pod["metadata"]["uid"], uid, "a view-only user deleted a pod");
    assert!(pod["metadata"]["deletionTimestamp"].is_null(), "a view-only user deleted a pod");
    let after = deployment(&http, &url).await;
    assert_eq!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"], "a view-only user changed the Deployment");
    screenshots(&client, "view-only").await;
    client.find(Locator::Css("nav a[data-view=\"loop\"]")).await.expect("loop link").click().await.expect("open the loop view");
    let loop_refused = wait_for(&browser, "the controllers refused", "return document.querySelector('#controllers .forbidden')?.textContent;").await;
    assert!(loop_refused.as_str().is_some_and(|m| m.contains("victor") && m.contains("/debug/controllers")), "{loop_refused}");
    client.find(Locator::Css("nav a[data-view=\"cluster\"]")).await.expect("cluster link").click().await.expect("open the cluster view");
    assert_no_page_errors(&client, "cluster, as a view-only user").await;

    // Signing out forgets the token; alice, an administrator, signs in and sees live data.
    client.find(Locator::Css("#sign-out")).await.expect("sign-out button").click().await.expect("sign out");
    wait_for(&browser, "the sign-in form again", "return !document.getElementById('login').hidden && !sessionStorage.getItem('shepherd-token');").await;
    sign_in(&browser, ALICE).await;
    wait_for(&browser, "alice signed in", SIGNED_IN).await;

    // The seed's Deployment appears with three ready pods.
    client.goto(&format!("{url}/dashboard/")).await.expect("open the dashboard");
    wait_for(&browser, "3 ready replicas", &ready_is(3)).await;
    wait_for(&browser, "3 running pods", "return document.querySelectorAll('tr[data-pod^=\"default/web-\"][data-phase=\"Running\"]').length === 3;").await;
    wait_for(&browser, "the node", "return document.querySelector('#nodes tr[data-node] .yes');").await;
    screenshots(&client, "cluster").await;

    // Deleting web-0 from the page: it goes and its replacement comes, without a reload.
    js(&client, "window.notReloaded = true; return true;").await;
    let uid = js(&client, "return document.querySelector('tr[data-pod=\"default/web-0\"]').dataset.uid;").await;
    client.find(Locator::Css("button[aria-label=\"Delete pod web-0\"]")).await.expect("delete button").click().await.expect("click");
    let gone = format!(
        "const rows = [...document.querySelectorAll('tr[data-pod^=\"default/web-\"]')];
         return !rows.some(r => r.dataset.uid === {uid}) && rows.filter(r => r.dataset.phase === 'Running').length === 3;"
    );
    wait_for(&browser, "web-0 replaced by a running pod", &gone).await;
    assert_eq!(js(&client, "return window.notReloaded === true;").await, json!(true), "the page reloaded");
    let feed = "return [...document.querySelectorAll('#events li')].map(li => li.textContent).join('\\n');";
    wait_for(&browser, "Events of the deleted pod and of its replacement",
        &format!("const t = (() => {{ {feed} }})(); return /Killing\\s*Pod web-0/.test(t) && (t.match(/Created pod: web-/g) || []).length >= 4 && t;"))
    .await;

    // Scaling to 5 from the page: five pods, and the replicaset controller's queue chart moved.
    let (loop_link, cluster_link) = ("nav a[data-view=\"loop\"]", "nav a[data-view=\"cluster\"]");
    client.find(Locator::Css(loop_link)).await.expect("loop link").click().await.expect("open the loop view");
    wait_for(&browser, "the replicaset controller's card", "return document.querySelector('[data-controller=\"replicaset\"]')?.offsetParent;").await;
    let added_before = js(&client, ADDED).await.as_u64().unwrap_or(0);
    client.find(Locator::Css(cluster_link)).await.expect("cluster link").click().await.expect("open the cluster view");
    submit(&client, "input[data-deployment=\"default/web\"]", "5").await;
    wait_for(&browser, "5 ready replicas", &ready_is(5)).await;
    wait_for(&browser, "5 running pods", "return document.querySelectorAll('tr[data-pod^=\"default/web-\"][data-phase=\"Running\"]').length === 5;").await;
    assert_eq!(deployment(&http, &url).await["spec"]["replicas"], json!(5));
    client.find(Locator::Css(loop_link)).await.expect("loop link").click().await.expect("open the loop view");
    let added = format!("const n = (() => {{ {ADDED} }})(); return n > {added_before} && n;");
    wait_for(&browser, "the replicaset queue chart to move", &added).await;
    let mode = js(&client, "return document.querySelector('[data-controller=\"replicaset\"]').dataset.mode;").await;
    assert_eq!(mode, json!("hybrid"));
    // The controllers at work come before the idle ones.
    let cards = "return [...document.querySelectorAll('#controllers [data-controller]')].map(c => [c.dataset.controller, c.dataset.worked === 'true']);";
    let order = js(&client, cards).await;
    let order: Vec<(String, bool)> = serde_json::from_value(order).expect("cards");
    let first_idle = order.iter().position(|(_, worked)| !worked).unwrap_or(order.len());
    assert!(order[first_idle..].iter().all(|(_, worked)| !worked), "an idle controller above one at work: {order:?}");
    assert!(order[..first_idle].iter().any(|(name, _)| name == "replicaset"), "{order:?}");
    assert_no_page_errors(&client, "loop").await;
    screenshots(&client, "loop").await;

    // What a person typed stays through redraws, also once the field has lost the focus, until
    // they submit it or press Escape, which shows the cluster's value again.
    client.find(Locator::Css("nav a[data-view=\"cluster\"]")).await.expect("cluster link").click().await.expect("open the cluster view");
    let scale = "input[data-deployment=\"default/web\"]";
    let field = type_into(&client, scale, "7").await;
    field.send_keys("\u{E004}").await.expect("press Tab"); // WebDriver's Tab: the focus moves on
    redraws(&browser, "cluster", 2).await;
    assert_eq!(field.prop("value").await.expect("value").as_deref(), Some("7"), "a redraw replaced what was typed");
    assert_eq!(deployment(&http, &url).await["spec"]["replicas"], json!(5), "typing alone changed the Deployment");
    field.click().await.expect("back into the field");
    field.send_keys(ESCAPE).await.expect("press Escape");
    field.send_keys("\u{E004}").await.expect("press Tab");
    redraws(&browser, "cluster", 2).await;
    assert_eq!(field.prop("value").await.expect("value").as_deref(), Some("5"), "Escape puts the cluster's value back");

    // Bad input from the page: the server's 422 message appears next to the field; nothing changes.
    let before = deployment(&http, &url).await;
    for bad in ["-1", "five"] {
        submit(&client, "input[data-deployment=\"default/web\"]", bad).await;
        let shown = wait_for(&browser, "the scale error", "return document.querySelector('[data-action=\"scale\"] .field-error')?.textContent;").await;
        let shown = shown.as_str().unwrap_or_default().to_string();
        assert!(shown.contains("spec.replicas") && shown.contains("is invalid"), "scale to {bad}: {shown}");
        js(&client, "document.querySelector('[data-action=\"scale\"] .field-error').textContent = ''; return true;").await;
    }
    submit(&client, "input[data-container=\"web\"]", "bad image").await;
    let shown = wait_for(&browser, "the image error", "return document.querySelector('[data-action=\"image\"] .field-error')?.textContent;").await;
    assert!(shown.as_str().is_some_and(|s| s.contains("containers[0].image") && s.contains("whitespace")), "{shown}");
    let after = deployment(&http, &url).await;
    assert_eq!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"], "bad input changed the Deployment");
    assert_no_page_errors(&client, "cluster").await;

    // Demo mode, the seeds' experiment live: the replicaset controller in edge mode losing every
    // event leaves a scale-up pending; switched to hybrid, its next resync repairs it.
    let card = "[data-controller=\"replicaset\"]";
    client.find(Locator::Css("nav a[data-view=\"loop\"]")).await.expect("loop link").click().await.expect("open the loop view");
    wait_for(&browser, "the demo banner", "return !document.getElementById('demo-banner').hidden;").await;
    // The view redraws every second; a person typing in its form keeps the focus through that.
    let period = client.find(Locator::Css(&format!("{card} input[name=\"periodSeconds\"]"))).await.expect("period field");
    period.click().await.expect("focus the period field");
    redraws(&browser, "loop", 3).await;
    let focused = js(&client, "return document.activeElement?.name || document.activeElement?.tagName;").await;
    assert_eq!(focused, json!("periodSeconds"), "a redraw took the focus from the field being typed in");
    tune_from_page(&client, card, "edge", "", "150").await;
    let refused = wait_for(&browser, "the demo form's error", &format!("return document.querySelector('{card} form.demo .field-error')?.textContent;")).await;
    assert!(refused.as_str().is_some_and(|m| m.contains("eventLoss")), "{refused}");
    tune_from_page(&client, card, "edge", "", "100").await;
    wait_for(&browser, "edge mode losing every event", &format!(
        "const c = document.querySelector('{card}'); return c.dataset.mode === 'edge' && c.dataset.eventLoss === '1';")).await;
    client.find(Locator::Css("nav a[data-view=\"cluster\"]")).await.expect("cluster link").click().await.expect("open the cluster view");
    submit(&client, "input[data-deployment=\"default/web\"]", "6").await;
    let desired = "return document.querySelector('[data-deployment=\"default/web\"]')?.dataset.desired === '6';";
    wait_for(&browser, "the Deployment to want 6", desired).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(js(&client, &ready_is(5)).await, json!(true), "the lost events must leave the scale-up pending");
    screenshots(&client, "demo-pending").await;
    client.find(Locator::Css("nav a[data-view=\"loop\"]")).await.expect("loop link").click().await.expect("open the loop view");
    tune_from_page(&client, card, "hybrid", "2", "100").await;
    wait_for(&browser, "hybrid mode", &format!("return document.querySelector('{card}').dataset.mode === 'hybrid';")).await;
    wait_for(&browser, "a resync", &format!("return document.querySelector('{card} [data-resync]')?.dataset.resync;")).await;
    client.find(Locator::Css("nav a[data-view=\"cluster\"]")).await.expect("cluster link").click().await.expect("open the cluster view");
    wait_for(&browser, "the resync to repair the scale-up: 6 ready", &ready_is(6)).await;
    assert_no_page_errors(&client, "demo").await;

    // The Benchmarks view: the trigger-mode experiment's table and plot from bench/results.
    client.find(Locator::Css("nav a[data-view=\"benchmarks\"]")).await.expect("benchmarks link").click().await.expect("open");
    let rows = wait_for(&browser, "the experiment's table", "return document.querySelectorAll('[data-result=\"trigger-modes.json\"] tbody tr').length;").await;
    assert!(rows.as_u64().is_some_and(|n| n >= 4), "{rows} rows");
    wait_for(&browser, "the plot", "const img = document.querySelector('[data-result=\"trigger-modes.json\"] img'); return img?.complete && img.naturalWidth > 0;").await;
    let text = js(&client, "return document.getElementById('benchmarks').textContent;").await;
    assert!(text.as_str().is_some_and(|t| t.contains("edge") && t.contains("hybrid")), "{text}");
    assert_no_page_errors(&client, "benchmarks").await;
    screenshots(&client, "benchmarks").await;

    client.close().await.expect("close the browser");
    drop(browser);
    drop(daemon);
}

/// Without `--token`, the `dashboard:` link standalone prints signs a browser in as the
/// administrator, takes the token out of the address bar, and stays good across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_link_signs_the_administrator_in() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let (daemon, printed) = standalone(dir.path(), &[]);
    let url = daemon.url.clone();
    let link = printed.strip_prefix("dashboard: ").and_then(|l| l.split_whitespace().next()).expect("a link").to_string();
    let token = link.strip_prefix(&format!("{url}/dashboard/#token=")).unwrap_or_else(|| panic!("not a sign-in link: {printed}"));
    let file = dir.path().join("data/admin.token");
    assert_eq!(std::fs::read_to_string(&file).expect("admin.token").trim(), token, "the link carries the kept token");
    let mode = std::fs::metadata(&file).expect("admin.token").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "admin.token is for its owner only");
    let nodes = https_client(dir.path()).get(format!("{url}/api/v1/nodes")).bearer_auth(token).send().await.expect("list nodes");
    assert_eq!(nodes.status(), 200, "the token is the administrator's");
    let refused = https_client(dir.path()).get(format!("{url}/api/v1/nodes")).bearer_auth("0".repeat(64)).send().await.expect("list nodes");
    assert_eq!(refused.status(), 401, "another token is not");

    let browser = Browser::start(DESKTOP.0, DESKTOP.1).await.unwrap_or_else(|e| panic!("{e}"));
    browser.client.goto(&link).await.expect("open the link");
    wait_for(&browser, "signed in from the link", SIGNED_IN).await;
    wait_for(&browser, "the node", "return document.querySelector('#nodes tr[data-node] .yes');").await;
    let address = js(&browser.client, "return location.href;").await;
    assert_eq!(address, json!(format!("{url}/dashboard/")), "the token left the address bar");
    assert_no_page_errors(&browser.client, "cluster, signed in from the link").await;

    drop(daemon);
    let (_again, printed_again) = standalone(dir.path(), &[]);
    assert!(printed_again.contains(&format!("#token={token} ")), "a restart keeps the token: {printed_again}");
    browser.client.clone().close().await.expect("close the browser");
}
