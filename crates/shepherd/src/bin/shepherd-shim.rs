//! The `shepherd-shim` program the node agent starts for each container (see `shepherd_shim`).

fn main() {
    shepherd_shim::main()
}
