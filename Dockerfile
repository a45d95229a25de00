# The kiln image: one static-ish binary on a distroless base, run as non-root. It serves
# `kiln controller` and `kiln webhook` (deploy/), and `kiln build` for CI. (Build Jobs run in
# the runtime builder images, which carry kiln themselves: `kiln base build RUNTIME`.)
#   docker build -t registry.example.com/kiln/kiln:0.1.0 .

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so a source change does not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked --bin kiln || true
COPY . .
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin kiln \
    && strip target/release/kiln
# Shell completions and the man page, generated from the binary's own flags.
RUN mkdir -p /share/bash-completion/completions /share/zsh/site-functions \
        /share/fish/vendor_completions.d /share/man/man1 \
    && target/release/kiln completions bash > /share/bash-completion/completions/kiln \
    && target/release/kiln completions zsh > /share/zsh/site-functions/_kiln \
    && target/release/kiln completions fish > /share/fish/vendor_completions.d/kiln.fish \
    && target/release/kiln man --dir /share/man/man1

# OpenSSH's ssh and the libraries it links that the distroless base lacks (it has libc6 and
# libssl3), for git sources over SSH (the controller resolves their references with it):
# copied, not installed, so the image keeps no shell or package manager. bookworm, as the
# distroless base below.
FROM debian:bookworm-slim AS ssh
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client \
    && mkdir /out && cp --parents -L /usr/bin/ssh /out/ \
    && for lib in $(ldd /usr/bin/ssh | awk '$3 ~ /^\// {print $3}'); do \
         case "${lib##*/}" in \
           libc.so.*|libresolv.so.*|libm.so.*|libdl.so.*|ld-linux*|libcrypto.so.*|libssl.so.*) ;; \
           *) cp --parents -L "$lib" /out/ ;; \
         esac; \
       done

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=ssh /out/ /
COPY --from=build /src/target/release/kiln /usr/local/bin/kiln
COPY --from=build /share/ /usr/local/share/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kiln"]
CMD ["--help"]
