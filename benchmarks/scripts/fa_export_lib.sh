# Sourced by benchmarks/scripts/fa_*_prepare.sh.
# fa_export GIT_DIR COMMIT DEST NAME FILE...: each FILE of COMMIT written to DEST/FILE byte for byte
# (its blob id checked against the commit's) and listed with that id in DEST/FILES; a file already
# there is left as it is. NAME prefixes the error message.
fa_export() {
  local git_dir=$1 commit=$2 dest=$3 name=$4 f want got
  shift 4
  for f in "$@"; do
    [ -e "$dest/$f" ] && continue
    mkdir -p "$dest/$(dirname "$f")"
    git --git-dir="$git_dir" cat-file blob "$commit:$f" > "$dest/$f"
    want=$(git --git-dir="$git_dir" rev-parse "$commit:$f")
    got=$(git hash-object "$dest/$f")
    [ "$want" = "$got" ] || { echo "$name: $f: exported blob $got != $want" >&2; return 1; }
    echo "$f $want" >> "$dest/FILES"
  done
}
