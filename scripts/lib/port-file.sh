# shellcheck shell=bash
# Sourced by the scripts that start logitd with --port_file=FILE and wait for
# it to write the port it listens on there.
#
#   wait_for_port_file PORT_FILE PID
#   Waits up to 60 s (120 looks, 0.5 s apart) for PORT_FILE to be non-empty,
#   and stops waiting early when process PID has ended. Returns 0 when
#   PORT_FILE has something in it, else 1; the caller reads the port.

wait_for_port_file() {
  local port_file=$1 pid=$2
  for _ in $(seq 1 120); do
    [ -s "$port_file" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  [ -s "$port_file" ]
}
