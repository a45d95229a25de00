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

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/kiln /usr/local/bin/kiln
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kiln"]
CMD ["--help"]
