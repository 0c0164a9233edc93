//! Rate limiters: how long a failed key waits before its next attempt. Small values that compose.
//!
//! `default_rate_limiter()` is the pair client-go users know: per-key exponential backoff (5 ms
//! doubling to 1000 s, reset by `forget`) combined with an overall token bucket (10/s, burst 100)
//! through `MaxOf`, so one hot failing key backs off alone while a storm of failures across many
//! keys is still held to the bucket's rate.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Decides the delay before a key's next attempt after a failure.
pub trait RateLimiter: Send + Sync + 'static {
    /// Records one more failure of `key` and returns how long it should wait.
    fn when(&self, key: &str) -> Duration;
    /// Forgets the failures of `key` (it succeeded); the next failure starts from the base delay.
    fn forget(&self, key: &str);
    /// Failures recorded for `key` since it was last forgotten.
    fn retries(&self, key: &str) -> u32;
}

/// Per-key exponential backoff: `base * 2^failures`, capped at `max`.
#[derive(Debug)]
pub struct ItemExponential {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl ItemExponential {
    pub fn new(base: Duration, max: Duration) -> Self {
        ItemExponential { base, max, failures: Mutex::default() }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RateLimiter for ItemExponential {
    fn when(&self, key: &str) -> Duration {
        let mut failures = self.failures();
        let n = failures.entry(key.to_string()).or_insert(0);
        let exp = *n;
        *n = n.saturating_add(1);
        let delay = 1u32.checked_shl(exp).map_or(self.max, |factor| self.base.saturating_mul(factor));
        delay.min(self.max)
    }

    fn forget(&self, key: &str) {
        self.failures().remove(key);
    }

    fn retries(&self, key: &str) -> u32 {
        self.failures().get(key).copied().unwrap_or(0)
    }
}

/// One bucket for all keys: `per_second` tokens refill, at most `burst` saved up. A retry that
/// finds the bucket empty waits for its token instead of being refused.
#[derive(Debug)]
pub struct TokenBucket {
    per_second: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Goes negative when retries reserve tokens ahead of time.
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    pub fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket { per_second: per_second.max(f64::MIN_POSITIVE), burst, state: Mutex::new(Bucket { tokens: burst, last: None }) }
    }
}

impl RateLimiter for TokenBucket {
    fn when(&self, _key: &str) -> Duration {
        let mut b = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if let Some(last) = b.last {
            b.tokens = (b.tokens + now.duration_since(last).as_secs_f64() * self.per_second).min(self.burst);
        }
        b.last = Some(now);
        b.tokens -= 1.0;
        if b.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-b.tokens / self.per_second) }
    }

    fn forget(&self, _key: &str) {}

    fn retries(&self, _key: &str) -> u32 {
        0
    }
}

/// The longest delay of several limiters; every limiter records every failure.
pub struct MaxOf(pub Vec<Box<dyn RateLimiter>>);

impl RateLimiter for MaxOf {
    fn when(&self, key: &str) -> Duration {
        self.0.iter().map(|l| l.when(key)).max().unwrap_or(Duration::ZERO)
    }

    fn forget(&self, key: &str) {
        self.0.iter().for_each(|l| l.forget(key));
    }

    fn retries(&self, key: &str) -> u32 {
        self.0.iter().map(|l| l.retries(key)).max().unwrap_or(0)
    }
}

/// A bucket of whole tokens for one key, kept by its owner (one per object, say): up to `burst`
/// tokens, one more earned per `interval`. Counting whole intervals keeps the arithmetic exact; a
/// fractional bucket, asked again and again, answers with waits of almost nothing, which a caller
/// that requeues on them turns into a busy loop (on tokio's paused clock, a hang).
#[derive(Debug, Clone, Copy)]
pub struct WholeTokens {
    burst: u32,
    interval: Duration,
    tokens: u32,
    /// When the last token was earned, or when the bucket was last seen full.
    refilled: Instant,
}

impl WholeTokens {
    /// A full bucket.
    pub fn full(burst: u32, interval: Duration, now: Instant) -> Self {
        let burst = burst.max(1);
        WholeTokens { burst, interval: interval.max(Duration::from_nanos(1)), tokens: burst, refilled: now }
    }

    /// Takes a token, or says how long until the next one is earned.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.refilled);
        let earned = (elapsed.as_nanos() / self.interval.as_nanos()).min(u128::from(self.burst)) as u32;
        if self.tokens + earned >= self.burst {
            // A full bucket earns nothing: the next token is due one interval after it is drawn.
            self.tokens = self.burst;
            self.refilled = now;
        } else {
            self.tokens += earned;
            self.refilled += self.interval * earned;
        }
        if self.tokens == 0 {
            return Err((self.refilled + self.interval).saturating_duration_since(now));
        }
        self.tokens -= 1;
        Ok(())
    }
}

/// Exponential per key (5 ms doubling to 1000 s) combined with a token bucket (10/s, burst 100).
pub fn default_rate_limiter() -> MaxOf {
    MaxOf(vec![
        Box::new(ItemExponential::new(Duration::from_millis(5), Duration::from_secs(1000))),
        Box::new(TokenBucket::new(10.0, 100)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_5ms_caps_at_1000s_and_resets_on_forget() {
        let l = ItemExponential::new(Duration::from_millis(5), Duration::from_secs(1000));
        let delays: Vec<u64> = (0..5).map(|_| l.when("k").as_millis() as u64).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80]);
        assert_eq!(l.when("other"), Duration::from_millis(5), "keys back off independently");
        for _ in 0..40 {
            l.when("k");
        }
        assert_eq!(l.when("k"), Duration::from_secs(1000));
        assert_eq!(l.retries("k"), 46);
        l.forget("k");
        assert_eq!(l.retries("k"), 0);
        assert_eq!(l.when("k"), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn the_token_bucket_allows_a_burst_then_spaces_retries_at_its_rate() {
        let b = TokenBucket::new(10.0, 100);
        for i in 0..100 {
            assert_eq!(b.when(&format!("k{i}")), Duration::ZERO);
        }
        assert_eq!(b.when("a"), Duration::from_millis(100));
        assert_eq!(b.when("b"), Duration::from_millis(200));
        tokio::time::advance(Duration::from_secs(1)).await;
        // Ten tokens refilled, two already promised: the next reservation waits behind none.
        assert_eq!(b.when("c"), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_limiter_takes_the_longer_of_backoff_and_bucket() {
        let l = default_rate_limiter();
        assert_eq!(l.when("k"), Duration::from_millis(5));
        for i in 0..99 {
            l.when(&format!("other{i}"));
        }
        // The bucket is empty now: 100 ms for the token beats the key's 10 ms backoff.
        assert_eq!(l.when("k"), Duration::from_millis(100));
    }

    #[test]
    fn whole_tokens_allow_a_burst_then_one_per_interval_and_say_how_long_to_wait() {
        let (start, interval) = (Instant::now(), Duration::from_secs(300));
        let mut bucket = WholeTokens::full(25, interval, start);
        assert_eq!((0..30).filter(|_| bucket.take(start).is_ok()).count(), 25);
        let almost = start + interval - Duration::from_secs(1);
        assert_eq!(bucket.take(almost), Err(Duration::from_secs(1)), "the wait is until the next whole token");
        assert!(bucket.take(start + interval).is_ok());
        assert_eq!(bucket.take(start + interval), Err(interval));
        let later = start + interval * 3;
        assert_eq!((0..5).filter(|_| bucket.take(later).is_ok()).count(), 2, "two more intervals, two more tokens");
        let much_later = start + interval * 1000;
        assert_eq!((0..30).filter(|_| bucket.take(much_later).is_ok()).count(), 25, "never more than a burst");
    }
}
