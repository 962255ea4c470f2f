#!/bin/sh
# prune.sh ROOT: removes what a node never reads from the rootfs at ROOT:
# docs, man pages, locales, apt's lists and caches (nothing installs packages
# in a running node), logs. Shared by base.sh and the Dockerfile.
set -eu
root=${1:?usage: prune.sh ROOT}
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* \
	"$root"/usr/share/locale/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* \
	"$root"/var/cache/debconf/*-old "$root"/var/log/*
