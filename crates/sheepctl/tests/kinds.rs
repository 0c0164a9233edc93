//! `sheepctl get` over several kinds at once (`deploy,svc`, the `all` category), and how every output ends.

mod common;

use common::Shepherd;
use serde_json::json;

fn setup() -> Shepherd {
    let s = Shepherd::server();
    s.ok("POST", "/apis/apps/v1/namespaces/default/deployments", Some(json!({"metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}})));
    s.ok("POST", "/api/v1/namespaces/default/services", Some(json!({"metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})));
    s
}

/// The NAME cells of every table, and how many tables there were.
fn names_and_tables(out: &str) -> (Vec<String>, usize) {
    let tables = out.split("\n\n").count();
    let names = out
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("NAME"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    (names, tables)
}

#[test]
fn comma_separated_kinds_print_one_table_per_kind_with_kind_qualified_names() {
    let s = setup();
    let out = s.sheepctl(&["get", "deploy,svc,pods"]).ok().to_string();
    assert_eq!(names_and_tables(&out), (vec!["deployment.apps/web".to_string(), "service/web".to_string()], 2), "{out}");
    assert!(out.ends_with('\n'), "{out:?}");
    let out = s.sheepctl(&["get", "svc,deploy", "-o", "name"]).ok().to_string();
    assert_eq!(out, "service/web\ndeployment.apps/web\n");
    let list: serde_json::Value = serde_json::from_str(s.sheepctl(&["get", "deploy,svc", "-o", "json"]).ok()).expect("json");
    assert_eq!(list["kind"], "List");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2));
}

#[test]
fn get_all_lists_the_kinds_of_the_all_category() {
    let s = setup();
    let out = s.sheepctl(&["get", "all"]).ok().to_string();
    assert_eq!(names_and_tables(&out), (vec!["service/web".to_string(), "deployment.apps/web".to_string()], 2), "{out}");
    let empty = s.sheepctl(&["get", "all", "-n", "kube-system"]);
    assert_eq!((empty.code, empty.stdout.as_str()), (0, ""));
    assert_eq!(empty.stderr.trim(), "No resources found in kube-system namespace.");
    let bad = s.sheepctl(&["get", "pods,widgets"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("the server doesn't have a resource type \"widgets\""), "{}", bad.stderr);
}

#[test]
fn every_output_form_ends_with_a_newline() {
    let s = setup();
    for args in [&["get", "all"][..], &["get", "deploy", "web"], &["get", "deploy", "web", "-o", "json"],
        &["get", "deploy,svc", "-o", "yaml"], &["get", "svc", "-o", "name"], &["describe", "svc", "web"],
        &["describe", "deploy", "web"], &["describe", "ns", "default"]] {
        let out = s.sheepctl(args).ok().to_string();
        assert!(!out.is_empty() && out.ends_with('\n'), "{args:?}: {out:?}");
    }
}
