//! Panics expected from libraries: arrow's IPC decoder and the Parquet reader panic on some
//! malformed input instead of failing. Nyala calls them under [`catch_quietly`], which turns
//! such a panic into a value; the process's panic hook does not print it (it is reported as the
//! error it becomes), while every other panic, a bug, is printed as before.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// This thread runs a call whose panic is caught and reported as an error.
    static EXPECTED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, returning its panic, if it panics, instead of unwinding further; the panic is not
/// printed by the panic hook (it is logged at debug level).
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> Result<T, Box<dyn Any + Send>> {
    install_hook();
    let outer = EXPECTED.replace(true);
    let result = catch_unwind(AssertUnwindSafe(f));
    EXPECTED.set(outer);
    result
}

/// The text of a caught panic.
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    (panic.downcast_ref::<String>().map(String::as_str))
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic")
}

fn install_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| match EXPECTED.get() {
            true => tracing::debug!(panic = %info, "caught a library's panic on malformed input"),
            false => previous(info),
        }));
    });
}
