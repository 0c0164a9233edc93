//! The dashboard in a real browser: Debian's headless Chromium, driven over WebDriver by
//! chromedriver, against a real `shepherd standalone` running the seed's Deployment as processes.
//! One cluster and one browser serve every step: what a person would do, in order.

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
    match browser.wait_for(script, Duration::from_secs(45)).await {
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
    events: [...document.querySelectorAll('#events li')].slice(0, 12).map(li => li.textContent)};";

async fn js(client: &Client, script: &str) -> Value {
    client.execute(script, vec![]).await.unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
}

/// Types `text` into the field `css` (replacing what it held) and submits its form.
async fn submit(client: &Client, css: &str, text: &str) {
    let field = client.find(Locator::Css(css)).await.unwrap_or_else(|e| panic!("no field {css}: {e}"));
    field.clear().await.expect("clear");
    field.send_keys(text).await.expect("type");
    field.send_keys("\u{E007}").await.expect("press Enter"); // WebDriver's Enter key
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
        tokio::time::sleep(Duration::from_millis(400)).await; // one throttled redraw at the new width
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
        let field = client.find(Locator::Css(&format!("{card} input[name=\"{name}\"]"))).await.expect("demo field");
        field.clear().await.expect("clear");
        field.send_keys(value).await.expect("type");
    }
    client.find(Locator::Css(&format!("{card} form.demo button"))).await.expect("apply").click().await.expect("click apply");
}

async fn deployment(url: &str) -> Value {
    reqwest::get(format!("{url}/apis/apps/v1/namespaces/default/deployments/web")).await.expect("get").json().await.expect("json")
}

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
    let daemon =
        Daemon::start("standalone", dir.path(), &["--restart-backoff-seconds", "0.2", "--dashboard-demo", "--bench-results", results]);
    let url = daemon.url.clone();
    let browser = Browser::start(DESKTOP.0, DESKTOP.1).await.unwrap_or_else(|e| panic!("{e}"));
    let client = browser.client.clone();

    let seed = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let http = reqwest::Client::new();
    let created = http.post(format!("{url}/apis/apps/v1/namespaces/default/deployments")).json(&seed).send().await.expect("create");
    assert!(created.status().is_success(), "create: {}", created.status());

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
    assert_eq!(deployment(&url).await["spec"]["replicas"], json!(5));
    client.find(Locator::Css(loop_link)).await.expect("loop link").click().await.expect("open the loop view");
    let added = format!("const n = (() => {{ {ADDED} }})(); return n > {added_before} && n;");
    wait_for(&browser, "the replicaset queue chart to move", &added).await;
    let mode = js(&client, "return document.querySelector('[data-controller=\"replicaset\"]').dataset.mode;").await;
    assert_eq!(mode, json!("hybrid"));
    assert_no_page_errors(&client, "loop").await;
    screenshots(&client, "loop").await;

    // Bad input from the page: the server's 422 message appears next to the field; nothing changes.
    client.find(Locator::Css("nav a[data-view=\"cluster\"]")).await.expect("cluster link").click().await.expect("open the cluster view");
    let before = deployment(&url).await;
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
    let after = deployment(&url).await;
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
    tokio::time::sleep(Duration::from_millis(2500)).await;
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
