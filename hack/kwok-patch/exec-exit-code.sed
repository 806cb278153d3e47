# After each local exec in kwok's server, keep the command's exit status (see zz_tensile_exitcode.go).
s/^\(\s*\)\(err :\?= utilsexec.Exec(ctx, cmd\[0\], cmd\[1:\]...)\)$/\1\2\n\1err = tensileExitCode(err)/
