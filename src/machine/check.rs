//! Compile-time checks used by [`state_machine!`](crate::state_machine). Each takes the
//! table as `(from, event, to)` discriminants, and a message naming the problem to panic
//! with (const evaluation turns the panic into a compile error).

/// Panics with `msg` if `(from, event)` appears more than once.
pub const fn unique_row(rows: &[(usize, usize, usize)], from: usize, event: usize, msg: &str) {
    let mut count = 0;
    let mut i = 0;
    while i < rows.len() {
        if rows[i].0 == from && rows[i].1 == event {
            count += 1;
        }
        i += 1;
    }
    if count > 1 {
        panic!("{}", msg);
    }
}

/// Panics with `msg` if `state` cannot be reached from `initial`.
pub const fn reachable(rows: &[(usize, usize, usize)], initial: usize, state: usize, msg: &str) {
    assert!(state < 128, "state_machine!: at most 128 states");
    let mut seen: u128 = 1 << initial;
    // Fixed point: at most one pass per state.
    let mut pass = 0;
    while pass < 128 {
        let mut i = 0;
        while i < rows.len() {
            if seen & (1 << rows[i].0) != 0 {
                seen |= 1 << rows[i].2;
            }
            i += 1;
        }
        pass += 1;
    }
    if seen & (1 << state) == 0 {
        panic!("{}", msg);
    }
}

/// Panics with `msg` unless a row leaves `from` on `event`.
pub const fn has_row(rows: &[(usize, usize, usize)], from: usize, event: usize, msg: &str) {
    let mut i = 0;
    while i < rows.len() {
        if rows[i].0 == from && rows[i].1 == event {
            return;
        }
        i += 1;
    }
    panic!("{}", msg);
}

/// Panics with `msg` if the timer `(state, event)` appears more than once.
pub const fn unique_timer(timers: &[(usize, usize)], state: usize, event: usize, msg: &str) {
    let mut count = 0;
    let mut i = 0;
    while i < timers.len() {
        if timers[i].0 == state && timers[i].1 == event {
            count += 1;
        }
        i += 1;
    }
    if count > 1 {
        panic!("{}", msg);
    }
}

/// A timer's delay, `n` `unit`s, in milliseconds; panics naming the problem if the
/// unit is unknown or the delay is not 1 ms to 366 days.
pub const fn timer_ms(n: i128, unit: &str) -> u64 {
    let size: i128 = if eq(unit, "ms") {
        1
    } else if eq(unit, "s")
        || eq(unit, "sec")
        || eq(unit, "secs")
        || eq(unit, "second")
        || eq(unit, "seconds")
    {
        1000
    } else if eq(unit, "min") || eq(unit, "mins") || eq(unit, "minute") || eq(unit, "minutes") {
        60 * 1000
    } else if eq(unit, "h") || eq(unit, "hour") || eq(unit, "hours") {
        3600 * 1000
    } else if eq(unit, "day") || eq(unit, "days") {
        24 * 3600 * 1000
    } else {
        panic!("state_machine!: a timer's unit is one of ms, s, min, h, days")
    };
    if n <= 0 {
        panic!("state_machine!: a timer's delay must be positive");
    }
    if n > super::MAX_TIMER_MS as i128 / size {
        panic!("state_machine!: a timer's delay must be at most 366 days");
    }
    (n * size) as u64
}

const fn eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Panics with `msg` if any row leaves `terminal`.
pub const fn no_edge_out_of(rows: &[(usize, usize, usize)], terminal: usize, msg: &str) {
    let mut i = 0;
    while i < rows.len() {
        if rows[i].0 == terminal {
            panic!("{}", msg);
        }
        i += 1;
    }
}

/// Panics with `what` if two states have one stored name (`all`, every state's), or if a
/// declared stored name (`declared`) is empty, longer than 64 bytes, or holds anything but
/// ASCII letters, digits, `_`, `-` and `.` (a name that goes into timers' references, the
/// graph's pictures and the operators' page as it is).
pub const fn stored_names(all: &[&str], declared: &[&str], what: &str) {
    let mut i = 0;
    while i < declared.len() {
        let n = declared[i].as_bytes();
        if n.is_empty() || n.len() > 64 {
            panic!("{}", what);
        }
        let mut k = 0;
        while k < n.len() {
            let c = n[k];
            if !(c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'.') {
                panic!("{}", what);
            }
            k += 1;
        }
        i += 1;
    }
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() {
            if eq(all[i], all[j]) {
                panic!("{}", what);
            }
            j += 1;
        }
        i += 1;
    }
}
