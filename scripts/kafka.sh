#!/usr/bin/env bash
# Prints the directory of the test Kafka broker's jars (e2e/testenv/kafka/pom.xml: Apache
# Kafka's, pinned, from Maven Central), copying them first if the cache has none for that
# pom: ~/.cache/ankusa/kafka-<hash>/lib, outside `target/` (once per machine). The broker
# runs on the machine's Java (17 or newer): `java -cp '<dir>/*' kafka.Kafka …`
# (ankusa_relay::testkit::KafkaBroker starts one per test on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
src=e2e/testenv/kafka
hash=$(cat "$src"/pom.xml | sha256sum | cut -c1-16)
dir=${XDG_CACHE_HOME:-$HOME/.cache}/ankusa/kafka-$hash
if [ ! -f "$dir/lib/.complete" ]; then
  mkdir -p "$dir"
  echo "kafka: copying the broker's jars from Maven Central (once)" >&2
  rm -rf "$dir/lib.part"
  mvn -q -B -Dstyle.color=never -f "$src/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$dir/lib.part" >&2
  touch "$dir/lib.part/.complete"
  rm -rf "$dir/lib" && mv "$dir/lib.part" "$dir/lib"
fi
echo "$dir/lib"
