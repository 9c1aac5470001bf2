pub fn run(_args: Args) -> crate::Outcome { todo!() }
#[derive(clap::Args)] pub struct Args {}
