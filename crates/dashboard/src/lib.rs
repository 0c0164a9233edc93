//! The web dashboard's assets, compiled into the binary and served under `/dashboard/`.
//!
//! The page is plain ES modules with no build step (see README.md): what is in `assets/` is what
//! the browser gets. It reads everything through the API's own list and watch calls, and the
//! controllers' state through `/debug/controllers?watch=true`.

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
    ("favicon.svg", "image/svg+xml", include_str!("../assets/favicon.svg")),
];

/// The content type and body of an asset, or `None` for a name the dashboard does not have.
pub fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    let name = if name.is_empty() { "index.html" } else { name };
    ASSETS.iter().find(|(n, _, _)| *n == name).map(|(_, ct, body)| (*ct, *body))
}

/// Routes for `/dashboard`, `/dashboard/` and `/dashboard/{asset}`. The assets hold no cluster
/// data, so they need no credentials; every call the page makes for data does.
pub fn router() -> Router {
    Router::new()
        .route(PREFIX, get(|| async { Redirect::permanent("/dashboard/") }))
        .route("/dashboard/", get(|| async { serve("") }))
        .route("/dashboard/{name}", get(|Path(name): Path<String>| async move { serve(&name) }))
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
