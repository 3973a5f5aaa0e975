// kvserve command-line entry point: dispatches subcommands.
#include <cstdio>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  std::fprintf(stderr, "usage: kvserve <generate|plan> [flags]\n");
  return 2;
}
