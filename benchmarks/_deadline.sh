# Sourced by the scripts of one GPU call: the seconds left to the call's deadline, and each step's
# time limit. The script sets CALL_START (epoch seconds its call began) and DEADLINE_S first.
left() { echo $(( DEADLINE_S - ($(date +%s) - CALL_START) )); }
# a step's time limit: min(DEFAULT, seconds left - RESERVE), at least 1.  Usage: limit DEFAULT [RESERVE]
limit() { local l=$(( $(left) - ${2:-0} )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }
