//! Pods' `/etc/resolv.conf` pointing at the cluster DNS, as kubelet's `--cluster-dns` gives them.

use std::net::IpAddr;

use serde_json::Value;
use shepherd_api::JsonPath;

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

impl ClusterDns {
    /// The resolv.conf of `pod`, or `None` when the pod keeps the node's: dnsPolicy `Default`,
    /// `None` (dnsConfig alone, not supported here), or `ClusterFirst` on the host network.
    pub fn resolv_conf(&self, pod: &Value) -> Option<String> {
        if self.nameservers.is_empty() {
            return None;
        }
        let host_network = pod.at("/spec/hostNetwork").and_then(Value::as_bool).unwrap_or(false);
        match pod.at("/spec/dnsPolicy").and_then(Value::as_str).unwrap_or("ClusterFirst") {
            "ClusterFirst" if !host_network => {}
            "ClusterFirstWithHostNet" => {}
            _ => return None,
        }
        let ns = pod.at("/metadata/namespace").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or("default");
        let d = self.domain.trim_matches('.');
        let mut out = format!("search {ns}.svc.{d} svc.{d} {d}\n");
        for ip in &self.nameservers {
            out.push_str(&format!("nameserver {ip}\n"));
        }
        out.push_str(&format!("options ndots:{NDOTS}\n"));
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
    fn without_a_cluster_dns_address_pods_keep_the_nodes_resolver() {
        let none = ClusterDns { nameservers: vec![], domain: "cluster.local".into() };
        assert_eq!(none.resolv_conf(&json!({"metadata": {"namespace": "a"}, "spec": {}})), None);
    }
}
