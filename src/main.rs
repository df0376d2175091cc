//! The `syncopate` command: parses arguments, runs a command, prints the error chain once.

fn main() {
    println!("syncopate");
}
