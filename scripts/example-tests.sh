# Sourced: the tests that build DPDK's example programs from the DPDK source package, which
# Debian serves only for bookworm. Elsewhere they are skipped by name, and said to be.
example_target=dpdk_examples
example_skips=(--skip rx_interrupts_wake_l3fwd_power --skip simple_mp_ --skip symmetric_mp_)
