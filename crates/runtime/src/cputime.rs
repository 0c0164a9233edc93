//! CPU time spent polling a future, summed over its polls on whichever threads ran them.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// CPU time of the calling thread so far (`CLOCK_THREAD_CPUTIME_ID`); zero if unavailable.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// Wraps a future and yields its output with the CPU time its polls took. Work the future waits
/// for on other threads or tasks is not counted; work done inline while polling is.
pub(crate) struct CpuTimed<F> {
    inner: Pin<Box<F>>,
    spent: Duration,
}

impl<F: Future> CpuTimed<F> {
    pub(crate) fn new(inner: F) -> Self {
        CpuTimed { inner: Box::pin(inner), spent: Duration::ZERO }
    }
}

impl<F: Future> Future for CpuTimed<F> {
    type Output = (F::Output, Duration);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let before = thread_cpu_time();
        let polled = self.inner.as_mut().poll(cx);
        let spent = thread_cpu_time().saturating_sub(before);
        self.spent += spent;
        polled.map(|out| (out, self.spent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_cpu_spent_while_polling_but_not_while_waiting() {
        // Spin until this thread has used 20 ms of CPU, however long that takes on a busy machine.
        let (_, busy) = CpuTimed::new(async {
            let start = thread_cpu_time();
            let mut x = 0u64;
            while thread_cpu_time().saturating_sub(start) < Duration::from_millis(20) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .await;
        assert!(busy >= Duration::from_millis(20), "busy loop measured {busy:?}");
        let (_, idle) = CpuTimed::new(tokio::time::sleep(Duration::from_millis(30))).await;
        assert!(idle < Duration::from_millis(10), "sleep measured {idle:?}");
    }
}
