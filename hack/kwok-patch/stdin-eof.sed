# kwok's local exec copies stdin into the command's pipe but never closes it, so a command
# reading stdin to its end (cat) never sees EOF: close the pipe when the copy ends.
s/^\(\s*\)_, _ = io.Copy(inPipe, opt.In)$/\1_, _ = io.Copy(inPipe, opt.In)\n\1_ = inPipe.Close()/
