//! Single-flight: concurrent requests for one key share one run of the work and its result.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use crate::error::{ImageError, Result};

type Flight<T> = Shared<BoxFuture<'static, Result<T>>>;

pub(crate) struct SingleFlight<K, T: Clone> {
    /// A key is here exactly while its work runs; callers arriving then await the same result.
    inflight: Arc<Mutex<HashMap<K, Flight<T>>>>,
}

impl<K: Eq + Hash + Clone + Send + 'static, T: Clone + Send + Sync + 'static> SingleFlight<K, T> {
    pub(crate) fn new() -> Self {
        SingleFlight {
            inflight: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Runs `work` unless a run for `key` is in progress, in which case it awaits that run. The
    /// work runs as its own task, so a caller that gives up does not cancel it for the others.
    pub(crate) async fn run<F>(&self, key: K, work: impl FnOnce() -> F) -> Result<T>
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        let shared = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(running) = inflight.get(&key) {
                running.clone()
            } else {
                let map = Arc::clone(&self.inflight);
                let done_key = key.clone();
                let work = work();
                // The task forgets the key itself, so the next request starts a fresh run even
                // when every caller of this one gave up. It cannot remove a newer run's entry: one
                // is only added once this entry is gone, and this insert holds the lock meanwhile.
                let task = tokio::spawn(async move {
                    let result = work.await;
                    map.lock().unwrap_or_else(|p| p.into_inner()).remove(&done_key);
                    result
                });
                let shared = async move {
                    task.await
                        .unwrap_or_else(|e| Err(ImageError::Internal(format!("pull task failed: {e}"))))
                }
                .boxed()
                .shared();
                inflight.insert(key, shared.clone());
                shared
            }
        };
        shared.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn ten_concurrent_callers_share_one_run_and_a_later_caller_runs_again() {
        let flights = SingleFlight::<String, usize>::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let callers = (0..10).map(|_| {
            let (runs, mut released) = (runs.clone(), released.clone());
            flights.run("busybox".to_string(), move || async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let _ = released.wait_for(|r| *r).await;
                Ok(n)
            })
        });
        // `join_all` polls every caller before the releaser runs, so all ten are attached by then.
        let releaser = async {
            while runs.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            release.send(true).unwrap();
        };
        let (results, ()) = tokio::join!(futures::future::join_all(callers), releaser);
        for result in results {
            assert_eq!(result.unwrap(), 1);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let again = flights.run("busybox".to_string(), || async { Ok(99) }).await.unwrap();
        assert_eq!(again, 99, "a run that finished does not answer later requests");
    }

    #[tokio::test]
    async fn every_waiting_caller_gets_the_failure_of_the_shared_run() {
        let flights = SingleFlight::<&'static str, ()>::new();
        let (a, b) = tokio::join!(
            flights.run("x", || async {
                tokio::task::yield_now().await;
                Err(ImageError::NotFound {
                    reference: "x".into(),
                    detail: "no such tag".into(),
                })
            }),
            flights.run("x", || async { Ok(()) }),
        );
        assert!(a.unwrap_err().is_not_found());
        assert!(b.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn a_run_whose_callers_all_gave_up_still_completes_and_is_then_forgotten() {
        let flights = SingleFlight::<&'static str, usize>::new();
        let done = Arc::new(AtomicUsize::new(0));
        let (release, mut released) = tokio::sync::watch::channel(false);
        let work = {
            let done = done.clone();
            move || async move {
                let _ = released.wait_for(|r| *r).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok(7)
            }
        };
        let mut only_caller = Box::pin(flights.run("x", work));
        assert!(
            futures::poll!(only_caller.as_mut()).is_pending(),
            "the run waits for its release"
        );
        drop(only_caller);
        release.send(true).unwrap();
        for _ in 0..10_000 {
            if done.load(Ordering::SeqCst) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            done.load(Ordering::SeqCst),
            1,
            "the pull finishes with no caller left (its blobs are kept)"
        );
        assert_eq!(
            flights.run("x", || async { Ok(0) }).await.unwrap(),
            0,
            "a finished run answers no one later"
        );
    }
}
