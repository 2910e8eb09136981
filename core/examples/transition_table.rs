//! Prints the transition table as Markdown (the copy in ARCHITECTURE.md is checked by a test).

fn main() {
    print!("{}", paddock_core::session::table::render());
}
