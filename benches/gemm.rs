//! (in progress: issue 4)
fn main() {}
