//! A linearizability checker for histories of one compare-and-set register (a row read,
//! written and conditionally updated by key):
//! Wing and Gong's search with Lowe's memoisation, the algorithm Porcupine and Knossos use.
//!
//! Each operation has an invocation and a response time. A write whose outcome the client
//! never learned (an error or a timeout) may have taken effect at any point after its
//! invocation, or not at all; a read that failed says nothing and is left out of the history.

use std::collections::HashSet;

/// One operation on the register; `None` values are "no row".
#[derive(Debug, Clone)]
pub struct Op {
    pub kind: Kind,
    /// When the client sent it (any monotonic clock, the same for all operations).
    pub invoked: u64,
    /// When the answer arrived; None: never (the outcome is unknown).
    pub returned: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Write(Option<i64>),
    /// A read and the value it returned.
    Read(Option<i64>),
    /// A compare-and-set that took effect: the value was `.0` and became `.1` (of unknown
    /// outcome: took effect or not).
    Cas(i64, i64),
    /// A compare-and-set that did not take effect: the value was not `.0`.
    CasFailed(i64),
}

/// Whether `ops` (on a register starting at `initial`) can be put in one order that respects
/// real time (an operation that returned before another was invoked comes first) and the
/// register's semantics. Returns a description of the problem if they cannot.
pub fn check(initial: Option<i64>, ops: &[Op]) -> Result<(), String> {
    // Events in time order: each operation's call, then its return (unknown: after all).
    #[derive(Clone, Copy)]
    struct Event {
        op: usize,
        call: bool,
        time: u64,
    }
    let mut events: Vec<Event> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        if matches!(op.kind, Kind::Read(_) | Kind::CasFailed(_)) && op.returned.is_none() {
            continue;
        }
        events.push(Event {
            op: i,
            call: true,
            time: op.invoked,
        });
        events.push(Event {
            op: i,
            call: false,
            time: op.returned.unwrap_or(u64::MAX),
        });
    }
    // Calls before returns at equal times (they overlap).
    events.sort_by_key(|e| (e.time, !e.call));
    // A doubly linked list over the events, so linearized operations can be lifted out.
    let n = events.len();
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut return_of = vec![usize::MAX; ops.len()];
    for (i, e) in events.iter().enumerate() {
        if !e.call {
            return_of[e.op] = i;
        }
    }
    const NONE: usize = usize::MAX;
    let mut head = if n == 0 { NONE } else { 0 };
    let unlink = |i: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>, head: &mut usize| {
        let (p, x) = (prev[i], next[i]);
        if p == NONE {
            *head = if x == n { NONE } else { x };
        } else {
            next[p] = x;
        }
        if x < n {
            prev[x] = p;
        }
    };
    let relink = |i: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>, head: &mut usize| {
        let (p, x) = (prev[i], next[i]);
        if p == NONE {
            *head = i;
        } else {
            next[p] = i;
        }
        if x < n {
            prev[x] = i;
        }
    };
    let mut linearized = vec![false; ops.len()];
    let mut seen: HashSet<(Vec<u64>, Option<i64>)> = HashSet::new();
    let bits = |linearized: &[bool]| -> Vec<u64> {
        let mut words = vec![0u64; linearized.len().div_ceil(64)];
        for (i, &l) in linearized.iter().enumerate() {
            if l {
                words[i / 64] |= 1 << (i % 64);
            }
        }
        words
    };
    // (call event, state before it)
    let mut stack: Vec<(usize, Option<i64>)> = Vec::new();
    let mut state = initial;
    let mut entry = head;
    let mut longest = 0;
    loop {
        if entry == NONE || entry >= n {
            return Ok(());
        }
        let event = events[entry];
        if !event.call && ops[event.op].returned.is_none() {
            // Only operations of unknown outcome remain: they need not have happened.
            return Ok(());
        }
        if event.call {
            let op = &ops[event.op];
            let after = match &op.kind {
                Kind::Write(v) => Some(*v),
                Kind::Read(v) => (*v == state).then_some(state),
                Kind::Cas(old, new) => (state == Some(*old)).then_some(Some(*new)),
                Kind::CasFailed(old) => (state != Some(*old)).then_some(state),
            };
            if let Some(after) = after {
                linearized[event.op] = true;
                if seen.insert((bits(&linearized), after)) {
                    stack.push((entry, state));
                    longest = longest.max(stack.len());
                    state = after;
                    unlink(entry, &mut next, &mut prev, &mut head);
                    unlink(return_of[event.op], &mut next, &mut prev, &mut head);
                    entry = head;
                    continue;
                }
                linearized[event.op] = false;
            }
            entry = next[entry];
            if entry == n {
                entry = NONE;
            }
        } else {
            // An operation returned that nothing before it explains: undo the last choice.
            let Some((call, before)) = stack.pop() else {
                return Err(format!(
                    "not linearizable: no order explains the history (at most {longest} of {} \
                     operations placed); {:?}",
                    ops.len(),
                    ops
                ));
            };
            let op = events[call].op;
            linearized[op] = false;
            state = before;
            relink(return_of[op], &mut next, &mut prev, &mut head);
            relink(call, &mut next, &mut prev, &mut head);
            entry = next[call];
            if entry == n {
                entry = NONE;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: Kind, invoked: u64, returned: Option<u64>) -> Op {
        Op {
            kind,
            invoked,
            returned,
        }
    }

    #[test]
    fn accepts_linearizable_and_refuses_stale_reads() {
        use Kind::*;
        // Overlapping write and read: either value may be read.
        let ok = [
            op(Write(Some(1)), 0, Some(10)),
            op(Read(Some(1)), 5, Some(6)),
        ];
        assert!(check(None, &ok).is_ok());
        let ok = [op(Write(Some(1)), 0, Some(10)), op(Read(None), 5, Some(6))];
        assert!(check(None, &ok).is_ok());
        // A read after the write returned must see it.
        let stale = [
            op(Write(Some(1)), 0, Some(10)),
            op(Read(None), 11, Some(12)),
        ];
        assert!(check(None, &stale).is_err());
        // A write of unknown outcome may have happened, or not, but not both ways.
        let unknown = [
            op(Write(Some(2)), 0, None),
            op(Read(Some(2)), 5, Some(6)),
            op(Read(None), 7, Some(8)),
        ];
        assert!(check(None, &unknown).is_err());
        let unknown = [op(Write(Some(2)), 0, None), op(Read(None), 7, Some(8))];
        assert!(check(None, &unknown).is_ok());
        // Two writers, reads that go back in time.
        let back = [
            op(Write(Some(1)), 0, Some(2)),
            op(Write(Some(2)), 3, Some(5)),
            op(Read(Some(2)), 6, Some(7)),
            op(Read(Some(1)), 8, Some(9)),
        ];
        assert!(check(None, &back).is_err());
    }

    #[test]
    fn compare_and_set_takes_effect_once() {
        use Kind::*;
        // Two compare-and-sets from the same value cannot both succeed (a lost update).
        let lost = [
            op(Write(Some(1)), 0, Some(1)),
            op(Cas(1, 2), 2, Some(4)),
            op(Cas(1, 3), 3, Some(5)),
        ];
        assert!(check(None, &lost).is_err());
        // One succeeds, the other sees the new value.
        let ok = [
            op(Write(Some(1)), 0, Some(1)),
            op(Cas(1, 2), 2, Some(4)),
            op(CasFailed(1), 3, Some(5)),
            op(Read(Some(2)), 6, Some(7)),
        ];
        assert!(check(None, &ok).is_ok());
        // A failed compare-and-set saw another value: the write before it returned.
        let stale = [op(Write(Some(1)), 0, Some(1)), op(CasFailed(1), 2, Some(3))];
        assert!(check(None, &stale).is_err());
        // A write applied twice: the value goes back to one a later write replaced.
        let twice = [
            op(Write(Some(1)), 0, Some(1)),
            op(Write(Some(2)), 2, Some(3)),
            op(Read(Some(1)), 4, Some(5)),
        ];
        assert!(check(None, &twice).is_err());
        // A compare-and-set of unknown outcome may take effect late, or never.
        let late = [
            op(Write(Some(1)), 0, Some(1)),
            op(Cas(1, 2), 2, None),
            op(Read(Some(1)), 3, Some(4)),
            op(Read(Some(2)), 5, Some(6)),
        ];
        assert!(check(None, &late).is_ok());
    }
}
