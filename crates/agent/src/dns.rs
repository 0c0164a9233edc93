//! Pods' `/etc/resolv.conf` pointing at the cluster DNS, as kubelet's `--cluster-dns` gives them.

use std::net::IpAddr;

use serde_json::Value;
use shepherd_api::{JsonPath, strings_at};

/// The cluster DNS a node's pods are told about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDns {
    pub nameservers: Vec<IpAddr>,
    /// The cluster's DNS domain, e.g. `cluster.local`.
    pub domain: String,
}

/// Kubernetes' `ndots`: a name with fewer dots than this tries the search path first, so
/// `web` and `web.default` find Services.
const NDOTS: u32 = 5;

/// Most nameservers a resolver reads (glibc's MAXNS), as Kubernetes limits them.
const MAX_NAMESERVERS: usize = 3;
/// Most search domains Kubernetes passes on.
const MAX_SEARCHES: usize = 32;

impl Default for ClusterDns {
    fn default() -> Self {
        ClusterDns { nameservers: Vec::new(), domain: "cluster.local".into() }
    }
}

/// A resolv.conf option: `ndots:5` is ("ndots", Some("5")), `edns0` ("edns0", None).
type ResolvOption = (String, Option<String>);

impl ClusterDns {
    /// The resolv.conf of `pod`, or `None` when the pod keeps the node's: dnsPolicy `Default`,
    /// `ClusterFirst` on the host network or with no cluster DNS known, `None` without nameservers.
    /// `spec.dnsConfig` adds nameservers and search domains and sets options, as kubelet merges it.
    pub fn resolv_conf(&self, pod: &Value) -> Option<String> {
        let host_network = pod.at("/spec/hostNetwork").and_then(Value::as_bool).unwrap_or(false);
        let ns = pod.at("/metadata/namespace").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or("default");
        let d = self.domain.trim_matches('.');
        let (mut nameservers, mut searches, mut options): (Vec<String>, Vec<String>, Vec<ResolvOption>) =
            match pod.at("/spec/dnsPolicy").and_then(Value::as_str).unwrap_or("ClusterFirst") {
                "ClusterFirst" | "ClusterFirstWithHostNet" if self.nameservers.is_empty() => return None,
                "ClusterFirst" if host_network => return None,
                "ClusterFirst" | "ClusterFirstWithHostNet" => (
                    self.nameservers.iter().map(ToString::to_string).collect(),
                    vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.to_string()],
                    vec![("ndots".into(), Some(NDOTS.to_string()))],
                ),
                "None" => (Vec::new(), Vec::new(), Vec::new()),
                _ => return None,
            };
        for n in strings_at(pod, "/spec/dnsConfig/nameservers").map(str::to_string) {
            if !nameservers.contains(&n) {
                nameservers.push(n);
            }
        }
        for s in strings_at(pod, "/spec/dnsConfig/searches").map(str::to_string) {
            if !searches.contains(&s) {
                searches.push(s);
            }
        }
        for o in pod.at("/spec/dnsConfig/options").and_then(Value::as_array).into_iter().flatten() {
            let Some(name) = o.at("/name").and_then(Value::as_str) else { continue };
            let value = o.at("/value").and_then(Value::as_str).map(str::to_string);
            match options.iter_mut().find(|(n, _)| n == name) {
                Some(existing) => existing.1 = value,
                None => options.push((name.to_string(), value)),
            }
        }
        if nameservers.is_empty() {
            return None;
        }
        nameservers.truncate(MAX_NAMESERVERS);
        searches.truncate(MAX_SEARCHES);
        let mut out = String::new();
        if !searches.is_empty() {
            out.push_str(&format!("search {}\n", searches.join(" ")));
        }
        for ip in &nameservers {
            out.push_str(&format!("nameserver {ip}\n"));
        }
        if !options.is_empty() {
            let opts: Vec<String> =
                options.iter().map(|(n, v)| v.as_ref().map_or_else(|| n.clone(), |v| format!("{n}:{v}"))).collect();
            out.push_str(&format!("options {}\n", opts.join(" ")));
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dns() -> ClusterDns {
        ClusterDns { nameservers: vec!["10.96.0.10".parse().unwrap()], domain: "cluster.local".into() }
    }

    #[test]
    fn a_cluster_first_pod_searches_its_namespace_then_the_cluster_with_ndots_5() {
        let pod = json!({"metadata": {"namespace": "shop"}, "spec": {}});
        assert_eq!(
            dns().resolv_conf(&pod).unwrap(),
            "search shop.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
        );
    }

    #[test]
    fn host_network_and_default_policy_pods_keep_the_nodes_resolver() {
        assert_eq!(dns().resolv_conf(&json!({"metadata": {"namespace": "a"}, "spec": {"hostNetwork": true}})), None);
        assert_eq!(dns().resolv_conf(&json!({"metadata": {"namespace": "a"}, "spec": {"dnsPolicy": "Default"}})), None);
        let with_host_net = json!({"metadata": {"namespace": "a"},
            "spec": {"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}});
        assert!(dns().resolv_conf(&with_host_net).unwrap().contains("nameserver 10.96.0.10"));
    }

    #[test]
    fn dns_config_adds_nameservers_and_searches_and_overrides_options() {
        let pod = json!({"metadata": {"namespace": "a"}, "spec": {"dnsConfig": {
            "nameservers": ["192.0.2.53", "10.96.0.10"], "searches": ["corp.example", "svc.cluster.local"],
            "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}});
        assert_eq!(
            dns().resolv_conf(&pod).unwrap(),
            "search a.svc.cluster.local svc.cluster.local cluster.local corp.example\n\
             nameserver 10.96.0.10\nnameserver 192.0.2.53\noptions ndots:2 edns0\n"
        );
    }

    #[test]
    fn policy_none_takes_everything_from_dns_config_even_without_a_cluster_dns() {
        let pod = json!({"metadata": {"namespace": "a"}, "spec": {"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["192.0.2.53"], "searches": ["corp.example"]}}});
        assert_eq!(
            ClusterDns::default().resolv_conf(&pod).unwrap(),
            "search corp.example\nnameserver 192.0.2.53\n"
        );
        let empty = json!({"metadata": {"namespace": "a"}, "spec": {"dnsPolicy": "None"}});
        assert_eq!(ClusterDns::default().resolv_conf(&empty), None);
    }

    #[test]
    fn without_a_cluster_dns_address_pods_keep_the_nodes_resolver() {
        let none = ClusterDns { nameservers: vec![], domain: "cluster.local".into() };
        assert_eq!(none.resolv_conf(&json!({"metadata": {"namespace": "a"}, "spec": {}})), None);
    }
}
