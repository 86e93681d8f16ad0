# Source with a kit's site folder: sets up Python for that installed kit (docs/gpu-host.md).
#   source scripts/kit-env.sh /tmp/specwatch-site
# The devkit's env.sh puts the site on PYTHONPATH, and Python reads .pth files only in site
# directories: add the folders a kit's .pth files name (0.5.15's nvidia-cutlass-dsl puts its
# `cutlass` package under nvidia_cutlass_dsl/python_packages that way).
_kit_site=${1:?usage: source kit-env.sh SITE}
source "$_kit_site/env.sh"
for _pth in "$_kit_site"/*.pth; do
  [ -f "$_pth" ] || continue
  while read -r _line || [ -n "$_line" ]; do   # the last line may lack its newline (cutlass-dsl's does)
    case $_line in ""|"#"*|import*) ;; *) [ -d "$_kit_site/$_line" ] && PYTHONPATH=$PYTHONPATH:$_kit_site/$_line ;; esac
  done < "$_pth"
done
export PYTHONPATH
unset _kit_site _pth _line
