//! End-to-end tests of the `gpumem` binary, one module per command (and one per concern
//! that every trace command shares: reading a trace, `--capacity`, where outputs go), all in one
//! test target so that they link once. Each test runs the binary as a user would and checks the
//! exit status, the message and what was left on disk.
#[path = "../../../gpumem/tests/support/build_fake.rs"]
mod build_fake;
mod common;

mod advise;
mod bench;
mod capacity;
mod convert;
mod help;
mod info_inspect_vmm;
mod map;
mod multigpu;
mod outputs;
mod replay;
mod report;
mod report_chromium;
mod torch_conf;
mod trace_input;
mod tune;
mod watch;
