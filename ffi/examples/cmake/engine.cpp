// A C++17 engine linked through livereg's CMake package: makes a table of
// its own, registers, beats, deregisters, removes the table. Exits 0 only if
// every call did what it should. Usage: engine TABLE_NAME
#include <livereg.h>

#include <cstdio>
#include <string>

namespace {

bool ok(livereg_result result, const char* what) {
    if (result != LIVEREG_OK) {
        std::fprintf(stderr, "%s: %s: %s\n", what, livereg_result_str(result),
                     livereg_last_error());
        return false;
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: engine TABLE_NAME\n");
        return 2;
    }
    const std::string name = argv[1];
    livereg_options options;
    livereg_options_default(&options);
    livereg_table* table = nullptr;
    if (!ok(livereg_create(name.c_str(), &options, &table), "create")) return 1;
    livereg_worker* worker = nullptr;
    bool fine = ok(livereg_register(table, 7, "cmake-engine", &worker), "register") &&
                ok(livereg_ping(worker), "ping") &&
                ok(livereg_deregister(worker), "deregister");
    livereg_close(table);
    fine = ok(livereg_unlink(name.c_str()), "unlink") && fine;
    if (fine) std::printf("engine: registered, pinged, deregistered\n");
    return fine ? 0 : 1;
}
