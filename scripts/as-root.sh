# Sourced first by the scripts that need root (package installs, hugepages, TAP interfaces).
# As root it does nothing. Otherwise it runs the calling script again under sudo, keeping the
# caller's Rust toolchain: sudo resets PATH and HOME, which would hide rustup's cargo.
if [ "$(id -u)" != 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "$(basename "$0"): needs root (packages, hugepages, TAP interfaces): run it as root" >&2
    exit 1
  fi
  exec sudo env PATH="$PATH" \
    CARGO_HOME="${CARGO_HOME:-$HOME/.cargo}" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" \
    bash "$0" "$@"
fi
