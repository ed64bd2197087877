#!/bin/sh
# trialbed-check [--states] DIR NAME...: the trial watch's check without an interpreter start.
#
# Prints what `trialbed-daemon check NAME... --dir DIR` prints (JSON: free_bytes of DIR's file
# system, each NAME's state, cpu_s) from shell builtins, /proc and one df. On the VM rack under
# TCG that costs 0.07 s of CPU against 0.48 s for the Python helper's start (each exec there
# costs 35-45 ms, an interpreter far more); ten hosts are asked each round. Where it cannot
# answer alone (no /proc, e.g. FreeBSD; a name it will not quote; a daemon that ended, whose
# log's last lines go in the answer) it hands over to the Python helper next to it, which
# answers the same question in full. --states: the states alone, no log even for a daemon that
# ended (the runner's wait for its senders to end).
set -u
logs=yes
if [ "${1-}" = --states ]; then
	logs=
	shift
fi
dir=$1
shift
helper="${0%/*}/trialbed-daemon"
full() { exec "$helper" check "$@" --dir "$dir"; }

[ -r /proc/self/stat ] || full "$@"
for name; do
	case $name in
	*[!A-Za-z0-9._:@+-]* | "") full "$@" ;;
	esac
done

# starttime (field 22) and state (field 3) of /proc/PID/stat; the command (field 2) may hold
# spaces and parentheses, so fields are counted after its last ')'.
stat_of() {
	read -r line 2>/dev/null <"/proc/$1/stat" || return 1
	set -- ${line##*) }
	state=$1
	shift 19
	started=$1
}

# running: its pid file names a live process that is the one started (not a recycled pid),
# not a zombie; ended: a pid file and no such process; absent: no pid file.
# Sets s (no subshell: each fork counts under TCG).
state_of() {
	pidfile="$dir/$1.pid"
	s=absent
	[ -e "$pidfile" ] || return 0
	s=ended pid= start=
	read -r pid start <"$pidfile" || [ -n "$pid" ] || return 0
	if stat_of "$pid" && [ "$state" != Z ] && { [ -z "$start" ] || [ "$start" = "$started" ]; }; then
		s=running
	fi
}

daemons=
for name; do
	state_of "$name"
	[ "$s" = ended ] && [ -n "$logs" ] && full "$@"
	daemons="$daemons${daemons:+, }\"$name\": {\"state\": \"$s\"}"
done
# df -P: a header of 7 words, then device, blocks, used, available (1024-byte blocks).
# shellcheck disable=SC2046
set -- $(df -Pk "$dir")
free=$((${11} * 1024))
# CPU time of this shell and its child (df), in the kernel's USER_HZ ticks (100).
stat_of $$
set -- ${line##*) }
shift 11
ticks=$(($1 + $2 + $3 + $4))
printf '{"free_bytes": %s, "daemons": {%s}, "cpu_s": %d.%02d}\n' \
	"$free" "$daemons" $((ticks / 100)) $((ticks % 100))
