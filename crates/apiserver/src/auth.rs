//! Who is making a request: the identity authentication attaches and authorization reads.
//!
//! Authentication puts a [`UserInfo`] into the request's extensions. A request that reaches the
//! handlers without one was let in by an unauthenticated listener (`--insecure-loopback`), which,
//! like Kubernetes' old insecure port, is not subject to authorization.

use std::collections::BTreeMap;

/// The authenticated user, as Kubernetes' `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Every authenticated user is in this group.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// Members have full access, whatever the RBAC objects say.
pub const MASTERS_GROUP: &str = "system:masters";
/// The group of every node agent (user `system:node:<name>`).
pub const NODES_GROUP: &str = "system:nodes";

impl UserInfo {
    /// A user named `name` in `groups`, plus `system:authenticated`.
    pub fn new(name: impl Into<String>, groups: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let mut groups: Vec<String> = groups.into_iter().map(Into::into).collect();
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_string());
        }
        UserInfo { name: name.into(), groups, ..UserInfo::default() }
    }

    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The node name of a node agent's identity (`system:node:NAME` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        self.name.strip_prefix("system:node:").filter(|_| self.in_group(NODES_GROUP))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_identity_needs_both_its_name_and_the_nodes_group() {
        assert_eq!(UserInfo::new("system:node:n1", [NODES_GROUP]).node_name(), Some("n1"));
        assert_eq!(UserInfo::new("system:node:n1", Vec::<String>::new()).node_name(), None);
        assert!(UserInfo::new("alice", ["dev"]).in_group(AUTHENTICATED_GROUP));
    }
}
