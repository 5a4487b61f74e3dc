//! The `hearth` command-line tool.
fn main() {}
