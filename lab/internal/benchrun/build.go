package benchrun

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// labDir is the lab module's directory in the repository.
const labDir = "lab"

// BuildCurrent builds bin/payments (the service, ./cmd/payments) and
// bin/paymentsbench (the load generator, lab/cmd/paymentsbench) from the
// working tree, as every benchmark runs them. It returns what go printed,
// for a log, and fails naming the binary that did not build.
func BuildCurrent(ctx context.Context, goBin string) ([]byte, error) {
	out, err := BuildAt(ctx, goBin, "", "./cmd/payments", "bin/payments")
	if err != nil {
		return out, fmt.Errorf("build bin/payments: %w", err)
	}
	more, err := BuildLab(ctx, goBin, "paymentsbench", "bin/paymentsbench")
	out = append(out, more...)
	if err != nil {
		return out, fmt.Errorf("build bin/paymentsbench: %w", err)
	}
	return out, nil
}

// BuildLab builds the lab's command name (lab/cmd/NAME, in the lab's own
// module) from the working tree into out, a path from the current
// directory (the repository's root). It returns what go printed.
func BuildLab(ctx context.Context, goBin, name, out string) ([]byte, error) {
	abs, err := filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	return exec.CommandContext(ctx, goBin, "-C", labDir, "build", "-o", abs, "./cmd/"+name).CombinedOutput()
}

// BuildAt builds the package pkg (./cmd/payments) into out, a path from
// the current directory (the repository's root): from git revision rev,
// extracted with `git archive` into a temporary directory, or from the
// working tree when rev is empty. It returns what git, tar and go printed,
// for a log; it fails when one of them does.
func BuildAt(ctx context.Context, goBin, rev, pkg, out string) ([]byte, error) {
	if rev == "" {
		return exec.CommandContext(ctx, goBin, "build", "-o", out, pkg).CombinedOutput()
	}
	abs, err := filepath.Abs(out)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var log bytes.Buffer
	if err := extract(ctx, rev, dir, &log); err != nil {
		return log.Bytes(), err
	}
	build := exec.CommandContext(ctx, goBin, "build", "-buildvcs=false", "-o", abs, pkg)
	build.Dir = dir
	output, err := build.CombinedOutput()
	log.Write(output)
	if err != nil {
		return log.Bytes(), fmt.Errorf("%s build %s at %s: %w", goBin, pkg, rev, err)
	}
	return log.Bytes(), nil
}

// extract is `git archive rev | tar -x -C dir`, failing when either side
// does; their messages go to log.
func extract(ctx context.Context, rev, dir string, log *bytes.Buffer) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	var archiveErr, tarErr bytes.Buffer
	archive := exec.CommandContext(ctx, "git", "archive", "--format=tar", rev)
	archive.Stdout, archive.Stderr = w, &archiveErr
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	untar.Stdin, untar.Stderr = r, &tarErr
	errArchive := archive.Start()
	errTar := untar.Start()
	// Only the children hold the pipe now, so tar sees its end when git exits.
	_ = r.Close()
	_ = w.Close()
	if errArchive == nil {
		errArchive = archive.Wait()
	}
	if errTar == nil {
		errTar = untar.Wait()
	}
	log.Write(archiveErr.Bytes())
	log.Write(tarErr.Bytes())
	if errArchive != nil {
		return fmt.Errorf("git archive %s: %w", rev, errArchive)
	}
	if errTar != nil {
		return fmt.Errorf("tar -x of %s: %w", rev, errTar)
	}
	return nil
}
