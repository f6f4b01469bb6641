//! Sandbox launcher; see `berth_runtime::launch`.

fn main() {
    berth_runtime::launch::launcher_main()
}
