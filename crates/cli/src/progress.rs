//! The one progress helper of the CLI: a bar on standard error when it is a terminal, nothing
//! otherwise (so pipes and logs stay clean).
use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps (`{bar} pos/len message`), hidden unless standard error is a terminal.
pub fn bar(len: u64) -> ProgressBar {
    if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new(len);
        if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}") {
            pb.set_style(style);
        }
        pb
    } else {
        ProgressBar::hidden()
    }
}
