# Sourced by the tests that run pinned npm packages (the oracles tests/tokenizer_oracle, tests/template_oracle; the
# server's client tests tests/cli/test_serve_*.sh with tests/server_clients): every npm package the folder's
# package.json pins, at its pinned version (a stale node_modules would compare against another oracle).
#
# usage: require_pinned_npm_packages <oracle folder> <how to install them>; exits 1 (the test FAILS) otherwise.
require_pinned_npm_packages() {
  local dir=$1 setup=$2
  command -v node > /dev/null || { echo "FAIL: node is not installed; $setup"; exit 1; }
  if ! node -e '
    const fs = require("fs"), path = require("path");
    const dir = process.argv[1];
    const want = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).dependencies;
    let ok = true;
    for (const [name, version] of Object.entries(want)) {
      let got = "missing";
      try { got = JSON.parse(fs.readFileSync(path.join(dir, "node_modules", name, "package.json"), "utf8")).version; }
      catch (e) {}
      if (got !== version) { console.log(`FAIL: ${name}: ${got} in node_modules, ${version} pinned`); ok = false; }
    }
    process.exit(ok ? 0 : 1);' "$dir"; then
    echo "FAIL: the npm packages are not installed as pinned in $dir/package-lock.json; $setup"
    exit 1
  fi
}
