# Sourced by demo.sh and test.sh: runs a build or test command and shows that it is moving. Ninja,
# when its output is not a terminal, prints a step only when it finishes, and one compile of the GPT
# example takes minutes, so a plain build looks hung. Every line comes through with ninja's counts
# ([done/total]) and the seconds since the script began; when nothing was printed for 30 s, a line
# says so with the last counts.
#
#   with_progress "build" cmake --build --preset default --target zerotk_example_02_gpt

progress_t0=${progress_t0:-$(date +%s)}
progress_quiet_s=${progress_quiet_s:-30}

with_progress() {
  local label=$1
  shift
  local last="starting" line
  # %f finished, %t total, %r running: ninja's own counts in front of every step it prints.
  NINJA_STATUS="[%f/%t done, %r running] " "$@" 2>&1 | {
    while true; do
      if IFS= read -r -t "$progress_quiet_s" line; then
        printf '%4ds  %s\n' $(( $(date +%s) - progress_t0 )) "$line"
        [[ $line =~ ^\[([0-9]+/[0-9]+)\ done ]] && last="${BASH_REMATCH[1]} steps done"
      elif (( $? > 128 )); then  # read timed out: nothing new for progress_quiet_s
        printf '%4ds  %s: still working (%s)\n' $(( $(date +%s) - progress_t0 )) "$label" "$last"
      else
        break  # end of output
      fi
    done
  }
  return "${PIPESTATUS[0]}"  # the command's status, with or without the caller's pipefail
}
