//! What the suite prints, kept as it is printed (`say!` prints a line and keeps it), so that
//! `--out DIR` can write the same text to `table.md`.

use std::sync::{Mutex, PoisonError};

/// The printed text, line by line.
static TEXT: Mutex<String> = Mutex::new(String::new());

/// Prints `line` and keeps it for the report file.
pub(crate) fn say_line(line: &str) {
    println!("{line}");
    let mut text = TEXT.lock().unwrap_or_else(PoisonError::into_inner);
    text.push_str(line);
    text.push('\n');
}

/// `println!` that also keeps the line (see [`say_line`]).
macro_rules! say {
    () => { $crate::report::say_line("") };
    ($($arg:tt)*) => { $crate::report::say_line(&format!($($arg)*)) };
}
pub(crate) use say;

/// Writes everything printed so far to `dir/table.md`; returns its path.
pub(crate) fn write(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    let text = TEXT.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let table = dir.join("table.md");
    std::fs::write(&table, text)?;
    Ok(table)
}
