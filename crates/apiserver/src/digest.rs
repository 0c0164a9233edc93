//! List digests (`GET <list path>?digest=total|buckets|N&resourceVersion=R`): the digest of the
//! (key, resourceVersion) pairs a list would return, as of revision `R`, without object bodies.
//!
//! The digest is computed over the current state and moved back to `R` through the store's watch
//! history: every write after `R` in the scope is undone (its new pair subtracted, its previous
//! pair added back). Label and field selectors apply to both sides of each write, so an object
//! that entered or left the scope after `R` counts as it stood at `R`. A revision older than the
//! retained history is 410 Expired, as a watch from it would be; one newer than the store's is
//! waited for briefly, as a list waits.

use std::collections::BTreeMap;

use futures::{FutureExt, StreamExt};
use shepherd_api::digest::{DigestDetail, ListDigest, SetDigest, bucket_of};
use shepherd_api::selector::Selection;
use shepherd_api::{ApiError, ResourceInfo};
use shepherd_store::{EventKind, KeyValue, Revision};

use crate::codec;
use crate::service::{ApiService, store_err};

/// Which objects a digest covers.
struct Scope {
    /// Store keys start with this; the object key is the rest.
    key_prefix: String,
    selection: Selection,
}

impl Scope {
    fn object_key<'a>(&self, kv: &'a KeyValue) -> &'a str {
        kv.key.strip_prefix(&self.key_prefix).unwrap_or(&kv.key)
    }

    fn contains(&self, kv: &KeyValue) -> Result<bool, ApiError> {
        codec::selected(&self.selection, kv)
    }
}

impl ApiService {
    /// The digest of what a list of `res` in `ns` with these selectors would hold at `revision`
    /// (the current revision when `None`).
    pub async fn digest(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        label_selector: Option<&str>,
        field_selector: Option<&str>,
        revision: Option<Revision>,
        detail: DigestDetail,
    ) -> Result<ListDigest, ApiError> {
        let scope = Scope {
            key_prefix: res.key_prefix(),
            selection: Selection::parse(label_selector, field_selector)?,
        };
        if let Some(rv) = revision {
            self.wait_for_revision(rv).await?;
        }
        let prefix = match (res.namespaced, ns) {
            (true, Some(ns)) => res.namespace_prefix(ns),
            _ => res.key_prefix(),
        };
        let current = self.store.list(&prefix, None, None).await.map_err(|e| store_err(res, "", e))?;
        let now = current.revision;
        let at = revision.unwrap_or(now).min(now);

        let mut set = SetDigest::default();
        // With one bucket asked for, its members by key (the revision of each).
        let wanted = detail.bucket();
        let mut members = BTreeMap::new();
        for kv in &current.items {
            if scope.contains(kv)? {
                let key = scope.object_key(kv);
                set.insert(key, kv.mod_revision);
                if wanted == Some(bucket_of(key)) {
                    members.insert(key.to_string(), kv.mod_revision);
                }
            }
        }

        if at < now {
            // The writes after `at` are all in the history (the list above saw them), so each
            // is ready at once; the first that is not, or is past `now`, ends the walk.
            let mut stream = self.store.watch(&prefix, at).await.map_err(|e| store_err(res, "", e))?;
            let mut undo = Vec::new();
            while let Some(Some(next)) = stream.next().now_or_never() {
                let event = next.map_err(|e| store_err(res, "", e))?;
                if event.revision() > now {
                    break;
                }
                undo.push(event);
            }
            for event in undo.iter().rev() {
                let key = scope.object_key(&event.kv);
                if event.kind != EventKind::Deleted && scope.contains(&event.kv)? {
                    set.remove(key, event.kv.mod_revision);
                    if wanted == Some(bucket_of(key)) {
                        members.remove(key);
                    }
                }
                if let Some(prev) = &event.prev
                    && scope.contains(prev)?
                {
                    set.insert(key, prev.mod_revision);
                    if wanted == Some(bucket_of(key)) {
                        members.insert(key.to_string(), prev.mod_revision);
                    }
                }
            }
        }

        Ok(ListDigest::of(at, &set, detail, members))
    }
}
