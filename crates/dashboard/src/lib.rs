//! The web dashboard's assets, compiled into the binary and served under `/dashboard/`.
//!
//! The page is plain ES modules with no build step (see README.md): what is in `assets/` is what
//! the browser gets. It reads everything through the API's own list and watch calls, and the
//! controllers' state through `/debug/controllers?watch=true`.

#[cfg(feature = "webdriver")]
pub mod webdriver;

use std::path::PathBuf;

use axum::Router;
use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// The path prefix the dashboard is served under.
pub const PREFIX: &str = "/dashboard";

/// Every asset: name under `/dashboard/`, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("../assets/index.html")),
    ("style.css", "text/css; charset=utf-8", include_str!("../assets/style.css")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("../assets/app.js")),
    ("api.js", "text/javascript; charset=utf-8", include_str!("../assets/api.js")),
    ("dom.js", "text/javascript; charset=utf-8", include_str!("../assets/dom.js")),
    ("cluster.js", "text/javascript; charset=utf-8", include_str!("../assets/cluster.js")),
    ("loop.js", "text/javascript; charset=utf-8", include_str!("../assets/loop.js")),
    ("benchmarks.js", "text/javascript; charset=utf-8", include_str!("../assets/benchmarks.js")),
    ("favicon.svg", "image/svg+xml", include_str!("../assets/favicon.svg")),
];

/// The content type and body of an asset, or `None` for a name the dashboard does not have.
pub fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    let name = if name.is_empty() { "index.html" } else { name };
    ASSETS.iter().find(|(n, _, _)| *n == name).map(|(_, ct, body)| (*ct, *body))
}

/// Routes for `/dashboard`, `/dashboard/` and `/dashboard/{asset}`. The assets hold no cluster
/// data, so they need no credentials; every call the page makes for data does.
///
/// `results`: the benchmark harness's results directory (`bench/results`); its trigger-mode
/// experiment files are served under `/dashboard/results/` for the Benchmarks view.
pub fn router(results: Option<PathBuf>) -> Router {
    let listing = results.clone();
    Router::new()
        .route(PREFIX, get(|| async { Redirect::permanent("/dashboard/") }))
        .route("/dashboard/", get(|| async { serve("") }))
        .route("/dashboard/{name}", get(|Path(name): Path<String>| async move { serve(&name) }))
        .route("/dashboard/results/", get(move || {
            let dir = listing.clone();
            async move { axum::Json(result_files(dir.as_deref())).into_response() }
        }))
        .route("/dashboard/results/{name}", get(move |Path(name): Path<String>| {
            let dir = results.clone();
            async move { result_file(dir.as_deref(), &name).await }
        }))
}

/// Only the trigger-mode experiment's own files: names from the harness, never a path.
fn is_result_file(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".json").or_else(|| name.strip_suffix(".svg")) else { return false };
    stem.starts_with("trigger-modes") && stem.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

fn result_files(dir: Option<&std::path::Path>) -> Vec<String> {
    let Some(entries) = dir.and_then(|d| std::fs::read_dir(d).ok()) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| is_result_file(n))
        .collect();
    names.sort();
    names
}

async fn result_file(dir: Option<&std::path::Path>, name: &str) -> Response {
    let not_found = || (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "no such result\n").into_response();
    let (Some(dir), true) = (dir, is_result_file(name)) else { return not_found() };
    match tokio::fs::read(dir.join(name)).await {
        Ok(bytes) => {
            let content_type = if name.ends_with(".svg") { "image/svg+xml" } else { "application/json" };
            ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff")], bytes).into_response()
        }
        Err(_) => not_found(),
    }
}

fn serve(name: &str) -> Response {
    match asset(name) {
        Some((content_type, body)) => (
            [(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff")],
            body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "no such dashboard asset\n")
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_is_served_for_the_bare_prefix_and_unknown_names_are_not_found() {
        assert_eq!(asset("").map(|a| a.0), Some("text/html; charset=utf-8"));
        assert!(asset("app.js").is_some_and(|(_, body)| body.contains("import")));
        assert!(asset("../Cargo.toml").is_none());
        assert!(asset("nothing.js").is_none());
    }

    #[test]
    fn only_the_experiment_s_own_result_files_are_served() {
        for ok in ["trigger-modes.json", "trigger-modes.svg", "trigger-modes-anti-entropy.json"] {
            assert!(is_result_file(ok), "{ok}");
        }
        for bad in ["store.json", "trigger-modes/../x.json", "../trigger-modes.json", "trigger-modes.json.bak", "Trigger-modes.svg"] {
            assert!(!is_result_file(bad), "{bad}");
        }
    }

    #[test]
    fn every_module_the_page_imports_is_an_asset() {
        for (name, _, body) in ASSETS {
            for line in body.lines().filter(|l| l.trim_start().starts_with("import ")) {
                let Some(from) = line.split('\'').nth(1) else { continue };
                let file = from.trim_start_matches("./");
                assert!(asset(file).is_some(), "{name} imports {from}, which is not served");
            }
        }
    }
}
