//! What Nyala's tests share (a dev-dependency only): [`wait_until`], the one way a test waits
//! for something that happens in the background — a leader elected, a flush, replicas that
//! converge — with a bound that is there for liveness, not as a timing measurement.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between attempts; each next one is twice as long, up to [`MAX_PAUSE`]:
/// something quick is seen at once, and a slow one is not asked about too often.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What one attempt returns: done (with a value), or not yet, perhaps saying why.
pub trait Attempt {
    type Output;
    fn done(self) -> Result<Self::Output, Option<String>>;
}

impl Attempt for bool {
    type Output = ();
    fn done(self) -> Result<(), Option<String>> {
        self.then_some(()).ok_or(None)
    }
}

impl<T> Attempt for Option<T> {
    type Output = T;
    fn done(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: Display> Attempt for Result<T, E> {
    type Output = T;
    fn done(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// Calls `attempt` until it is done (`true`, `Some`, `Ok`) and returns its value, pausing a
/// little between calls; panics naming `what` (and the last error) once `timeout` has passed.
/// `attempt` may itself panic to fail at once, e.g. on an error no retry will mend.
///
/// `attempt` is a closure that returns a future (`|| async { .. }`), not an async closure
/// (`async || { .. }`): a task spawned on tokio must be `Send`, which the compiler cannot yet
/// prove of an async closure's future (rust-lang/rust#100013).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::{Duration, Instant};
/// let start = Instant::now();
/// let waited = nyala_testkit::wait_until("30 ms to pass", Duration::from_secs(5), || async {
///     let elapsed = start.elapsed();
///     (elapsed >= Duration::from_millis(30)).then_some(elapsed)
/// })
/// .await;
/// assert!(waited >= Duration::from_millis(30));
/// # }
/// ```
pub async fn wait_until<A: Attempt, F: Future<Output = A>>(
    what: &str,
    timeout: Duration,
    mut attempt: impl FnMut() -> F,
) -> A::Output {
    let deadline = Instant::now() + timeout;
    let mut pause = FIRST_PAUSE;
    loop {
        let last = match attempt().await.done() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            match last {
                Some(e) => panic!("gave up waiting for {what} after {timeout:?}: {e}"),
                None => panic!("gave up waiting for {what} after {timeout:?}"),
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}
