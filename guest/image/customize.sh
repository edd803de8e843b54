#!/bin/sh
# mmdebstrap customize hook for the lab guest image: $1 is the root filesystem being built.
set -eu
root=$1

printf '/dev/vda / ext4 defaults,noatime 0 1\n' > "$root/etc/fstab"

# DHCP on the one virtio NIC; QEMU's user network answers DNS at 10.0.2.3.
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nType=ether\n\n[Network]\nDHCP=ipv4\n' > "$root/etc/systemd/network/80-dhcp.network"
printf 'nameserver 10.0.2.3\n' > "$root/etc/resolv.conf"
mkdir -p "$root/etc/systemd/system/systemd-networkd-wait-online.service.d"
printf '[Service]\nExecStart=\nExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=20\n' \
    > "$root/etc/systemd/system/systemd-networkd-wait-online.service.d/any.conf"
chroot "$root" systemctl enable systemd-networkd.service systemd-networkd-wait-online.service

# cloud-init reads only the NoCloud seed (KubeVirt's cloudInitNoCloud) and leaves networking to networkd.
cat > "$root/etc/cloud/cloud.cfg.d/90-lab.cfg" <<'CFG'
datasource_list: [NoCloud, None]
network: {config: disabled}
CFG

# Every boot is a fresh guest: its own machine id and the hostname from the seed's meta-data.
: > "$root/etc/machine-id"
rm -f "$root/etc/hostname" "$root/var/lib/dbus/machine-id"

mkdir -p "$root/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' > "$root/etc/systemd/journald.conf.d/volatile.conf"

# Units a short-lived lab guest has no use for, each costing boot time under TCG.
chroot "$root" systemctl mask e2scrub_all.timer e2scrub_reap.service fstrim.timer apt-daily.timer \
    apt-daily-upgrade.timer dpkg-db-backup.timer getty@tty1.service systemd-binfmt.service \
    sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount >/dev/null

rm -rf "$root/var/cache/apt/"*.bin "$root/var/lib/apt/lists/"*
