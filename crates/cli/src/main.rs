//! The `gpumem` command-line tool.
fn main() {
    println!("gpumem");
}
