//! Per-user limits on writes: a token bucket per authenticated user for mutating requests, answered
//! with Kubernetes' `429 TooManyRequests` and a `Retry-After` that client-go honours.
//!
//! API priority and fairness is Kubernetes' answer; a bucket per user keeps one runaway client from
//! taking the store from everyone, which is the part that matters on one machine. Members of
//! `system:masters` are exempt, as APF's `exempt` priority level makes them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::auth::{MASTERS_GROUP, UserInfo};
use crate::http::AppState;

/// Writes per second each user may make, and how many at once after a quiet spell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

/// Buckets idle this long are full again and are forgotten.
const FORGET_AFTER_BUCKETS: usize = 10_000;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UserLabel {
    user: String,
}

/// The buckets of every user who wrote recently.
#[derive(Debug)]
pub struct UserRateLimiter {
    limit: RateLimit,
    buckets: Mutex<HashMap<String, Bucket>>,
    refused: Family<UserLabel, Counter>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl UserRateLimiter {
    pub fn new(limit: RateLimit) -> UserRateLimiter {
        UserRateLimiter { limit, buckets: Mutex::default(), refused: Family::default() }
    }

    /// `shepherd_rate_limited_requests_total{user}`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "shepherd_rate_limited_requests",
            "Mutating requests refused with 429 because their user wrote faster than its limit",
            self.refused.clone(),
        );
    }

    /// Takes one token for `user` at `now`; `Err(wait)` when there is none, with how long until one.
    fn take(&self, user: &str, now: Instant) -> Result<(), Duration> {
        let RateLimit { per_second, burst } = self.limit;
        let burst = f64::from(burst.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > FORGET_AFTER_BUCKETS {
            // A bucket refilled to the brim holds nothing worth keeping.
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * per_second < burst);
        }
        let bucket = buckets.entry(user.to_string()).or_insert(Bucket { tokens: burst, at: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * per_second).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - bucket.tokens) / per_second))
    }
}

/// The middleware: mutating requests of authenticated users outside `system:masters` take a token.
pub(crate) async fn limit(State(app): State<AppState>, req: Request, next: axum::middleware::Next) -> Response {
    let Some(limiter) = &app.config.rate_limiter else { return next.run(req).await };
    let mutating = matches!(*req.method(), Method::POST | Method::PUT | Method::PATCH | Method::DELETE);
    let user = req.extensions().get::<UserInfo>().filter(|u| mutating && !u.in_group(MASTERS_GROUP));
    let Some(user) = user else { return next.run(req).await };
    match limiter.take(&user.name, Instant::now()) {
        Ok(()) => next.run(req).await,
        Err(wait) => {
            limiter.refused.get_or_create(&UserLabel { user: user.name.clone() }).inc();
            too_many(&user.name, limiter.limit, wait)
        }
    }
}

fn too_many(user: &str, limit: RateLimit, wait: Duration) -> Response {
    // Whole seconds, at least one: what `Retry-After` can say and clients wait.
    let seconds = wait.as_secs_f64().ceil().max(1.0) as u64;
    let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("too many requests from user {user:?}: at most {} writes per second (bursts of {}); \
            retry after {seconds}s", limit.per_second, limit.burst),
        "reason": "TooManyRequests", "details": {"retryAfterSeconds": seconds}, "code": 429});
    let mut r = Response::new(axum::body::Body::from(status.to_string()));
    *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_a_burst_then_the_rate_and_others_are_not_held_back() {
        let limiter = UserRateLimiter::new(RateLimit { per_second: 2.0, burst: 3 });
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.take("bob", t0).is_ok());
        }
        let wait = limiter.take("bob", t0).expect_err("the burst is spent");
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert!(limiter.take("alice", t0).is_ok(), "another user has a bucket of her own");
        assert!(limiter.take("bob", t0 + Duration::from_millis(500)).is_ok(), "a token after 1/rate");
        assert!(limiter.take("bob", t0 + Duration::from_millis(500)).is_err());
        // A long quiet spell refills to the burst, not beyond it.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(limiter.take("bob", later).is_ok());
        }
        assert!(limiter.take("bob", later).is_err());
    }

    #[test]
    fn a_refusal_says_when_to_come_back() {
        let r = too_many("bob", RateLimit { per_second: 0.5, burst: 1 }, Duration::from_millis(1200));
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }
}
